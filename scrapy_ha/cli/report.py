"""``scrapy-ha report SPIDER --since 24h``: a crawl's summary over a window, for a daily check.

What it reads: the live counts per state; the dead-letter queue's entries dead-lettered in
the window (their times are in the dead sorted set), by class, domain and reason; the
crawl-wide counters the workers keep in Redis (totals and per-minute buckets, kept for a
day), when the crawl has them; the workers seen in the window (their last heartbeats, kept a
week whether they are alive or gone). Times come from
the Redis server's clock, the one the workers stamp with.
"""

from __future__ import annotations

__all__ = ["Report", "build_report", "report"]

import html
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy_ha.codec.log_masking import one_line
from scrapy_ha.deadletters.dlq import SCAN_BATCH, parse_entry
from scrapy_ha.ops.display import local_time, share_text, time_ms
from scrapy_ha.ops.stats import MINUTE_MS, MINUTES_KEPT, read_crawl_stats_async
from scrapy_ha.store.payloads import read_payloads
from scrapy_ha.store.sharding import shards_of
from scrapy_ha.store.wire import text
from scrapy_ha.store.zpaging import by_score

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterable

    from scrapy_ha.ops.stats import CrawlStats
    from scrapy_ha.store.queue import RedisQueue

#: How many domains and reasons the report lists (the rest are summed as "others").
TOP = 5
#: Events of the window, in the order shown (``dead`` from the dead-letter queue's times).
EVENTS = ("enqueued", "acked", "retried", "dead")


@dataclass
class Report:
    """What ``scrapy-ha report`` prints."""

    spider: str
    since: str  # the start of the window, a local date-time as every command prints it
    until: str
    window_s: int
    states: dict[str, int]
    #: Events in the window: from the per-minute counters when the crawl has them (None
    #: otherwise), dead letters from the dead-letter queue's own times.
    window: dict[str, int | None]
    totals: dict[str, int]
    retry_success_rate: float | None
    dead_by_class: dict[str, int]
    top_domains: list[tuple[str, int]]
    top_reasons: list[tuple[str, int]]
    #: The workers whose last heartbeat is in the window (alive or gone), and when.
    workers_seen: list[str] = field(default_factory=list)
    workers_last_seen: dict[str, str] = field(default_factory=dict)


def _window_events(stats: CrawlStats, window_s: int) -> dict[str, int | None]:
    """Events in the window from the per-minute counters (None where the window is longer
    than the day they are kept, or the crawl keeps none: 0 for an event it never had).

    A minute the window begins in counts for its part inside the window, and the current
    minute for the part of what has passed of it (events taken as spread evenly over their
    minute, as ``status`` rates take them): counted whole, ``--since 1m`` at 40 s into a
    minute summed 100 s of events, ``--since 10s`` a whole minute's. A bucket of a minute
    to come (written by hand) is in no window that ends now."""
    if window_s > MINUTES_KEPT * 60 or not stats.minutes:
        return dict.fromkeys(EVENTS)
    since, now = stats.now_ms - window_s * 1000, stats.now_ms
    out: dict[str, int | None] = {}
    for event in EVENTS:
        total = 0.0
        for minute, n in stats.minutes.get(event, {}).items():
            start, end = minute * MINUTE_MS, min((minute + 1) * MINUTE_MS, now)
            if end < since or start > now:
                continue
            inside = end - max(start, since)
            total += n if end <= start or inside >= end - start else n * inside / (end - start)
        out[event] = round(total)
    return out


async def _dead_in_window(
    queue: RedisQueue, since_ms: int, until_ms: int
) -> tuple[int, Counter[str], Counter[str], Counter[str]]:
    """Dead letters of the window, by class, domain and reason (the dead set's own times),
    of every shard of a sharded crawl."""
    by_class: Counter[str] = Counter()
    domains: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    n = 0
    for shard in shards_of(queue):
        found = await _dead_in_shard(shard, (since_ms, until_ms), by_class, domains, reasons)
        n += found
    return n, by_class, domains, reasons


async def _dead_in_shard(
    queue: RedisQueue,
    window: tuple[int, int],
    by_class: Counter[str],
    domains: Counter[str],
    reasons: Counter[str],
) -> int:
    """Read by score from after the last entry read, never at an offset: ``ZRANGEBYSCORE
    ... LIMIT offset`` walks the offset entry by entry (a QA run's report of 300,000 dead
    letters held Redis, and every worker, 29 s in 554 calls of up to 150 ms each), and a
    read by rank skips or reads again as many entries as left or came before that rank
    meanwhile (a QA run: a dead-letter queue at its cap, dropping its oldest as new ones
    came, read 19,780 to 19,940 of the 20,000 in the window): ``zpaging.by_score``."""
    client, keys = queue.client, queue.keys
    n = 0
    async for rows in by_score(client, keys.dead, *window, SCAN_BATCH):
        n += len(rows)
        ids = [text(r[0]) for r in rows]
        infos = await client.hmget(keys.dead_info, ids)
        payloads = await read_payloads(client, keys, ids)
        for (_, score), entry_id, info, payload in zip(rows, ids, infos, payloads, strict=True):
            entry = parse_entry(entry_id, score, info, payload)
            by_class[entry.failure_class] += 1
            domains[entry.domain or "?"] += 1
            # one line (a QA run: a reason's newline broke the text and the markdown rows)
            reasons[" ".join((entry.reason or "?").split()) or "?"] += 1
    return n


async def build_report(queue: RedisQueue, window_s: int) -> Report:
    """The report of *queue*'s crawl over the last *window_s* seconds."""
    client, keys = queue.client, queue.keys
    stats = await read_crawl_stats_async(client, keys, domains=False)
    since_ms = stats.now_ms - window_s * 1000
    window = _window_events(stats, window_s)
    # every worker whose last heartbeat is in the window, gone or alive (renew.lua keeps
    # them a week in ``seen``; a worker that left is no longer in ``workers``)
    # (written by hand: a worker id not UTF-8 shown escaped; a time of `inf`, or to come,
    # left out: it read "last seen 9999-12-30 23:59:59" in a window ending now. The bound
    # leaves a minute for a heartbeat renewed since the server's time was read.) Read
    # before the dead letters: a QA run's walk of 300,000 took over a minute, the live
    # worker's heartbeat was renewed past the bound meanwhile, and the report said
    # "workers seen: 0" next to "workers 1".
    seen = await client.zrangebyscore(
        keys.seen, since_ms, stats.now_ms + MINUTE_MS, withscores=True
    )
    last = {text(w): time_ms(t) for w, t in seen}
    dead, by_class, domains, reasons = await _dead_in_window(queue, since_ms, stats.now_ms)
    window["dead"] = dead  # the dead-letter queue's own times: right for any window
    states = {
        "pending": stats.pending,
        "leased": stats.leased,
        "delayed": stats.delayed,
        "dead": stats.dead,
        "workers": stats.workers,
    }
    return Report(
        spider=keys.spider,
        since=local_time(since_ms),
        until=local_time(stats.now_ms),
        window_s=window_s,
        states=states,
        window=window,
        totals=dict(sorted(stats.counters.items())),
        retry_success_rate=stats.retry_success_rate,
        dead_by_class=dict(by_class.most_common()),
        top_domains=domains.most_common(TOP),
        top_reasons=reasons.most_common(TOP),
        workers_seen=sorted(last),
        workers_last_seen={w: local_time(t) for w, t in sorted(last.items())},
    )


def _n(value: int | None) -> str:
    return "n/a" if value is None else str(value)


def _rate(report: Report) -> str:
    return share_text(report.retry_success_rate)


def _last_seen(r: Report) -> str:
    return ", ".join(f"{w} last seen {r.workers_last_seen.get(w, '?')}" for w in r.workers_seen)


def as_text(r: Report) -> str:
    lines = [
        f"scrapy-ha report of {r.spider}: {r.since} .. {r.until}",
        "states:     " + ", ".join(f"{k} {v}" for k, v in r.states.items()),
        "in window:  " + ", ".join(f"{k} {_n(v)}" for k, v in r.window.items()),
        f"retries:    success rate {_rate(r)} (retried then done vs retried then dead)",
        "dead by class:  " + (", ".join(_pairs(r.dead_by_class.items())) or "-"),
        "dead by domain: " + (", ".join(_pairs(r.top_domains)) or "-"),
        "dead by reason: " + ("; ".join(f"{k} ({v})" for k, v in r.top_reasons) or "-"),
        f"workers seen:   {len(r.workers_seen)}"
        + (f" ({_last_seen(r)})" if r.workers_seen else ""),
    ]
    return "\n".join(lines)


def _pairs(counts: Iterable[tuple[str, int]]) -> list[str]:
    """``name n`` of each (class or domain, count), the name on one line."""
    return [f"{one_line(name)} {n}" for name, n in counts]


def _cell(text: str) -> str:
    """A reason, class or domain as a markdown table's cell: a ``|`` would end the cell, a
    line break the row, and HTML (an exception's message may quote a page; Scrapy keeps a
    link's host as written, ``c<!--.example``) would be rendered as such."""
    return html.escape(one_line(text).replace("|", "/"), quote=False)


def as_markdown(r: Report) -> str:
    out = [f"## scrapy-ha report: {r.spider}", "", f"{r.since} .. {r.until}", ""]
    out += ["| state | count |", "|---|---:|"]
    out += [f"| {k} | {v} |" for k, v in r.states.items()]
    out += ["", "| in the window | count |", "|---|---:|"]
    out += [f"| {k} | {_n(v)} |" for k, v in r.window.items()]
    out += ["", f"Retry success rate: **{_rate(r)}**", ""]
    out += ["| dead-letter class | count |", "|---|---:|"]
    out += [f"| {_cell(k)} | {v} |" for k, v in r.dead_by_class.items()]
    out += ["", "| domain | dead |", "|---|---:|"]
    out += [f"| {_cell(k)} | {v} |" for k, v in r.top_domains]
    out += ["", "| reason | dead |", "|---|---:|"]
    out += [f"| {_cell(k)} | {v} |" for k, v in r.top_reasons]
    out += ["", f"Workers seen: {len(r.workers_seen)} " + _last_seen(r)]
    return "\n".join(out)


async def report(queue: RedisQueue, args: argparse.Namespace) -> int:
    """A crawl's summary over a window (--since 24h): states, done/retried/dead, retry
    success rate, dead letters by class, domain and reason, workers seen."""
    r = await build_report(queue, args.since)
    if args.format == "json":
        doc: dict[str, Any] = asdict(r)
        print(json.dumps(doc))
    elif args.format == "markdown":
        print(as_markdown(r))
    else:
        print(as_text(r))
    return 0
