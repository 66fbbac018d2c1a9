"""What a continuous crawl shows (``scrapy-ha status``, the dashboard, the metrics): the
revisited requests, those due within the next hour, what the visits found, the change rate
found, the bytes 304 answers saved and the intervals scheduled. Read from the crawl-wide
counters that ``lua/revisit.lua`` moves and from ``ha:{S}:revisits`` (each revisited
entry's next due time)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy_ha.config.continuous import INTERVAL_BUCKETS
from scrapy_ha.keys import Keys
from scrapy_ha.ops.display import share_text
from scrapy_ha.ops.stats import counters
from scrapy_ha.ops.unreadable import UNREADABLE, explain_sync, unforeseen
from scrapy_ha.store.connection import REDIS_DOWN_ERRORS

if TYPE_CHECKING:
    from collections.abc import Mapping

    from scrapy_ha.ops.crawls import Reading

__all__ = ["DUE_WINDOW", "RevisitNumbers", "read_revisits", "read_revisits_sync", "status_lines"]

#: Seconds ahead that "due soon" counts: the next hour.
DUE_WINDOW = 3600
#: What a visit found, in the order shown.
FOUND = ("new", "changed", "unchanged", "not_modified", "unknown", "failed")


@dataclass(frozen=True)
class RevisitNumbers:
    """A crawl's revisits at one instant."""

    #: revisited entries (each with a next visit less than a day past), and those due
    #: within DUE_WINDOW seconds
    revisited: int = 0
    due_soon: int = 0
    #: visits by what they found (new, changed, unchanged, not_modified, unknown; failed:
    #: a visit that failed, its URL revisited still)
    found: dict[str, int] = field(default_factory=dict)
    #: bytes of the bodies 304 answers did not send again
    saved_bytes: int = 0
    #: revisits ended as doubles (another entry revisits the URL)
    doubles: int = 0
    #: intervals scheduled, by histogram bound (seconds as text, or "inf"), and their sum (s)
    intervals: dict[str, int] = field(default_factory=dict)
    interval_sum: float = 0.0

    def __bool__(self) -> bool:
        return bool(self.revisited or sum(self.found.values()))

    @property
    def change_rate(self) -> float | None:
        """Of the revisits that looked (not first visits), the share that found the page
        changed; None before any."""
        looked = sum(self.found.get(f, 0) for f in ("changed", "unchanged", "not_modified"))
        return self.found.get("changed", 0) / looked if looked else None

    def as_dict(self) -> dict[str, Any]:
        rate = self.change_rate
        return {
            "revisited": self.revisited,
            "due_next_hour": self.due_soon,
            "found": self.found,
            "change_rate": None if rate is None else round(rate, 4),
            "saved_bytes": self.saved_bytes,
            "doubles": self.doubles,
            "intervals": self.intervals,
        }


def revisit_numbers(counters: Mapping[str, int], revisited: int, due_soon: int) -> RevisitNumbers:
    """The numbers from the crawl-wide counters and the two counts of ``revisits``."""
    found = {k.split(":", 1)[1]: v for k, v in counters.items() if k.startswith("revisited:")}
    raw = {k.split(":", 1)[1]: v for k, v in counters.items() if k.startswith("revisit_iv:")}
    order = [*map(str, INTERVAL_BUCKETS), "inf"]  # by bound (as text, 21600 came before 300)
    bounds = {b: raw[b] for b in order if b in raw} | raw
    return RevisitNumbers(
        revisited=revisited,
        due_soon=due_soon,
        found=found,
        saved_bytes=counters.get("revisit_saved", 0),
        doubles=counters.get("revisit_double", 0),
        intervals=bounds,
        interval_sum=counters.get("revisit_iv_ms", 0) / 1000,
    )


def _counters(raw: Mapping[Any, Any]) -> dict[str, int]:
    """The revisits' counters of the crawl's stats (read as :func:`counters` reads them)."""
    return {k: v for k, v in counters(dict(raw)).items() if k.startswith("revisit")}


async def read_revisits(client: Any, keys: Keys, now_ms: int) -> RevisitNumbers:
    """A crawl's revisits (an asyncio client; one pipelined round trip)."""
    pipe = client.pipeline(transaction=False)
    _queue_reads(pipe, keys, now_ms)
    stats, revisited, soon = await pipe.execute()
    return revisit_numbers(_counters(stats), int(revisited), int(soon))


def read_revisits_sync(client: Any, keys: Keys, now_ms: int) -> RevisitNumbers:
    """The same with a blocking client (the metrics exporter's)."""
    pipe = client.pipeline(transaction=False)
    _queue_reads(pipe, keys, now_ms)
    stats, revisited, soon = pipe.execute()
    return revisit_numbers(_counters(stats), int(revisited), int(soon))


def _queue_reads(pipe: Any, keys: Keys, now_ms: int) -> None:
    pipe.hgetall(keys.stats)
    pipe.zcard(keys.revisits)
    pipe.zcount(keys.revisits, "-inf", now_ms + DUE_WINDOW * 1000)  # overdue ones are due


def status_lines(numbers: RevisitNumbers) -> list[str]:
    """The revisit lines of ``scrapy-ha status`` (none for a crawl without revisits)."""
    if not numbers:
        return []
    found = ", ".join(f"{f} {numbers.found[f]:,}" for f in FOUND if numbers.found.get(f))
    rate = numbers.change_rate
    changed = "" if rate is None else f"; changed at {share_text(rate)} of the revisits"
    intervals = ", ".join(
        f"{_bound(b)} {numbers.intervals[b]:,}"
        for b in [*map(str, INTERVAL_BUCKETS), "inf"]
        if numbers.intervals.get(b)
    )
    return [
        f"{'revisits':>13}  {numbers.revisited:,} URLs, {numbers.due_soon:,} due in the next "
        f"hour; found {found or 'nothing yet'}{changed}",
        f"{'304s saved':>13}  {_size(numbers.saved_bytes)}"
        + (f"; {numbers.doubles:,} doubles ended" if numbers.doubles else ""),
        f"{'intervals':>13}  {intervals or 'none yet'}",
    ]


def _bound(bound: str) -> str:
    """``<=1h``: a histogram bound as people read it."""
    if bound == "inf":
        return ">7d"
    seconds = int(bound)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"<={seconds // size}{unit}"
    return f"<={seconds}s"


def _size(n: int) -> str:
    if n < 1024:
        return f"{n:,} B"
    size = float(n)
    for unit in ("KB", "MB", "GB"):
        size /= 1024
        if size < 1024 or unit == "GB":
            break
    return f"{size:,.1f} {unit}"


def revisit_metrics(client: Any, prefix: str, reading: Reading) -> list[Any]:
    """The Prometheus metrics of the continuous crawls among those *reading* read (those
    with revisit counters; one more pipelined read each for what is due): revisited URLs,
    due within the hour, visits by what they found, bytes 304s saved, the histogram of
    intervals. A crawl whose revisits cannot be read is added to ``reading.unreadable``."""
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    urls = GaugeMetricFamily(
        "scrapy_ha_revisited_urls", "Revisited URLs (entries with a next visit).", labels=["spider"]
    )
    due = GaugeMetricFamily(
        "scrapy_ha_revisits_due_soon", "Revisits due within the next hour.", labels=["spider"]
    )
    visits = CounterMetricFamily(
        "scrapy_ha_revisits",
        "Visits of revisited URLs, by what they found: new (first), changed, unchanged (same "
        "content), not_modified (a 304), unknown, failed (retries spent; revisited still).",
        labels=["spider", "found"],
    )
    saved = CounterMetricFamily(
        "scrapy_ha_revisit_saved_bytes",
        "Bytes of bodies 304 answers did not send again.",
        labels=["spider"],
    )
    intervals = HistogramMetricFamily(
        "scrapy_ha_revisit_interval_seconds",
        "Intervals scheduled between two visits (adaptive ones shrink on change).",
        labels=["spider"],
    )
    for c in reading.crawls:
        if not any(k.startswith("revisit") for k in c.stats.counters):
            continue  # not a continuous crawl (a sharded one keeps no revisits)
        try:
            numbers = read_revisits_sync(client, Keys(prefix, c.spider), c.stats.now_ms)
        except UNREADABLE as exc:
            reading.unreadable[c.spider] = explain_sync(client, prefix, c.spider, exc).reason
            continue
        except REDIS_DOWN_ERRORS:
            raise
        except Exception as exc:
            reading.unreadable[c.spider] = unforeseen(c.spider, exc)
            continue
        urls.add_metric([c.spider], numbers.revisited)
        due.add_metric([c.spider], numbers.due_soon)
        for found, n in sorted(numbers.found.items()):
            visits.add_metric([c.spider, found], n)
        saved.add_metric([c.spider], numbers.saved_bytes)
        intervals.add_metric([c.spider], _buckets(numbers), sum_value=numbers.interval_sum)
    return [urls, due, visits, saved, intervals]


def _buckets(numbers: RevisitNumbers) -> list[tuple[str, float]]:
    """The cumulative buckets of the interval histogram, ``+Inf`` last."""
    total, buckets = 0, []
    for bound in INTERVAL_BUCKETS:
        total += numbers.intervals.get(str(bound), 0)
        buckets.append((str(float(bound)), float(total)))
    buckets.append(("+Inf", float(total + numbers.intervals.get("inf", 0))))
    return buckets
