"""Every crawl under a key prefix, read from Redis: which crawls there are (one SCAN of the
key space) and each one's numbers (one pipelined round trip, one more per sharded crawl),
for ``scrapy-ha metrics`` and the dashboard."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy_ha.keys import Keys
from scrapy_ha.ops.pipes import OneByOne, pipeline_of
from scrapy_ha.ops.stats import CrawlStats, counters, merge_stats
from scrapy_ha.ops.unreadable import (
    UNREADABLE,
    explain_sync,
    raise_first,
    read_layout_keys,
    unforeseen,
)
from scrapy_ha.store import scripts
from scrapy_ha.store.bloom_state import BloomState, bloom_state
from scrapy_ha.store.connection import REDIS_DOWN_ERRORS
from scrapy_ha.store.items import StreamState, merged, stream_state
from scrapy_ha.store.runs import STOP_OVERRIDES, stopped_when
from scrapy_ha.store.script_keys import counts_keys
from scrapy_ha.store.sharding import layout_problem, read_layout
from scrapy_ha.store.wire import Counts

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

logger = logging.getLogger(__name__)

#: Keys a SCAN step asks for: few round trips on a big database, and each step still takes
#: Redis only a few milliseconds.
SCAN_COUNT = 10_000
#: Keys whose presence means a crawl exists (a finished crawl keeps its dead letters and
#: counters; the other keys of a crawl go with these).
CRAWL_KEYS = ("ready", "waiting", "pending", "leased", "delayed", "dead", "workers", "stats")
#: Request states, as the ``state`` label.
STATES = ("pending", "leased", "delayed", "dead")
#: The ``class`` label of retries or dead letters the total counts but no class does.
UNKNOWN_CLASS = "unknown"


@dataclass(frozen=True)
class CrawlNumbers:
    """What Redis holds about one crawl at one instant: its numbers as ``scrapy-ha status``
    reads them (without the per-minute and per-domain counts: Prometheus makes its own
    rates, and a label per domain would grow without bound), and its domains gated now."""

    stats: CrawlStats
    gated_domains: int
    paused: bool = False
    #: stopped by ``scrapy-ha stop``, and no worker started since (store.runs.stopped_at)
    stopped: bool = False
    #: its item stream (``HA_ITEMS = "outbox"``): length and each sink's group
    items: StreamState = field(default_factory=StreamState)
    #: Redis's memory is above the back-pressure mark: workers lease nothing new
    backpressure: bool = False
    #: the Bloom filter of each shard (none: the exact set)
    blooms: tuple[BloomState, ...] = ()

    @property
    def dupefilter_error(self) -> float:
        """The chance now that a new URL is taken for a seen one (never crawled): the
        worst shard's; 0 for the exact set."""
        return max((b.error_now for b in self.blooms), default=0.0)

    @property
    def false_positives(self) -> float:
        """URLs the Bloom filter took for seen ones so far, as expected (an estimate)."""
        return sum(b.expected_false_positives for b in self.blooms)

    @property
    def spider(self) -> str:
        return self.stats.spider

    @property
    def states(self) -> dict[str, int]:
        s = self.stats
        return dict(zip(STATES, (s.pending, s.leased, s.delayed, s.dead), strict=True))

    @property
    def held(self) -> bool:
        """Whether Redis holds anything of the crawl (nothing once it was flushed)."""
        s = self.stats
        return bool(s.active or s.dead or s.workers or s.counters)

    def by_class(self, event: str) -> dict[str, int]:
        """``<event>:<class>`` counters per class; what the total counts beyond the classes
        goes to ``unknown``, so that the classes always add up to the total."""
        prefix = f"{event}:"
        counters = self.stats.counters
        classes = {k[len(prefix) :]: v for k, v in counters.items() if k.startswith(prefix)}
        rest = self.stats.counter(event) - sum(classes.values())
        if rest > 0:
            classes[UNKNOWN_CLASS] = classes.get(UNKNOWN_CLASS, 0) + rest
        return classes


def _glob_escape(text: str) -> str:
    return "".join(f"\\{c}" if c in "\\*?[]" else c for c in text)


def crawls_match(prefix: str) -> str:
    """The SCAN pattern of the keys that say a crawl is there: ``<prefix>:{<spider>}:``
    then a name that begins as theirs do (CRAWL_KEYS, ``shards``, ``paused``, ``items``,
    ``run``...), not as a back queue (``q:<qid>``, one per host) or a checkpoint
    (``cp:<task>``). Redis matches it while it scans, so a crawl of a million hosts costs
    the SCAN its steps, not a million names sent and read here (a QA run: the dashboard's
    overview took 0.8 to 1.0 s at 50,000 keys, 0.03 s at 1,000)."""
    return _glob_escape(f"{prefix}:{{") + "*}:[dilprsw]*"


class KeyNames:
    """Key names as text, for the SCANs that find crawls: a name that is not UTF-8 (no
    scrapy-ha key: another program's) is skipped and counted, and logged the first time
    one is (an exporter or a dashboard keeps one of these: not on every scrape or page),
    so that it never fails the read of every crawl."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.skipped: list[bytes] = []
        self.logged = False

    def scan(self) -> None:
        """Start a new SCAN: nothing skipped yet."""
        self.skipped = []

    def text(self, raw: Any) -> str | None:
        """*raw* as text; None (and counted) when it is not UTF-8."""
        try:  # (strict: a name escaped would be a crawl whose keys do not exist)
            return raw.decode() if isinstance(raw, bytes) else str(raw)
        except UnicodeDecodeError:
            self.skipped.append(raw)
            return None

    def log(self) -> None:
        """Say what the SCAN skipped, the first time one skipped any."""
        if not self.skipped or self.logged:
            return
        self.logged = True
        logger.warning(
            "skipped %d key name(s) under %s: that are not UTF-8 (no crawl of scrapy-ha has "
            "one; another program's?), the first %r: every other crawl is read as before",
            len(self.skipped),
            self.prefix,
            self.skipped[0],
        )


def discover(client: Any, prefix: str, names: KeyNames | None = None) -> list[str]:
    """The spiders of every crawl under *prefix* (one SCAN of the key space), sorted; a
    key name that is not UTF-8 is skipped (*names*: logged once for all its SCANs)."""
    head = f"{prefix}:{{"
    spiders, sharded = set(), set()
    names = names or KeyNames(prefix)
    names.scan()
    for raw in client.scan_iter(match=crawls_match(prefix), count=SCAN_COUNT):
        key = names.text(raw)
        if key is None or not key.startswith(head):  # SCAN's MATCH is a glob: checked again
            continue
        for name in CRAWL_KEYS:
            tail = f"}}:{name}"
            if key.endswith(tail) and len(key) > len(head) + len(tail):
                spiders.add(key[len(head) : -len(tail)])
        if key.endswith(SHARD_COUNT_TAIL):
            sharded.add(key[len(head) : -len(SHARD_COUNT_TAIL)])
    names.log()
    pipe = client.pipeline(transaction=False)
    for crawl in sorted(sharded):
        pipe.get(Keys(prefix, crawl).shard_count)
    layouts = zip(sorted(sharded), pipe.execute(raise_on_error=False), strict=True)
    return unsharded(spiders | sharded, dict(layouts))


#: How the key of a sharded crawl's shard count ends (``ha:{books}:shards``): an
#: unsharded crawl has none.
SHARD_COUNT_TAIL = "}:shards"


def unsharded(tags: Iterable[str], layouts: Mapping[str, Any] | None = None) -> list[str]:
    """The crawls of these hash tags, sorted: a sharded crawl (one of *layouts*, whose shard
    count is in Redis: crawl -> that count as read, or one whose shard 0 has keys) stands
    for its shards' (``books:0``, ``books:1``, ...), whichever have keys: shard 0 may have
    none (no request placed in it yet), and shard 1 is then no crawl of its own. Only the
    shards its layout spans are its: beside ``books`` of 3 shards, ``books:7`` is a crawl
    of its own (of a crawl whose count is unreadable or not in Redis, every ``books:<N>``
    is taken for a shard: its span is not known)."""
    tags = set(tags)
    spans = {crawl: _span(stored) for crawl, stored in (layouts or {}).items()}
    for tag in tags:
        if f"{tag}:0" in tags:
            spans.setdefault(tag, None)
    return sorted(t for t in tags if not _is_shard(t, spans))


def _span(stored: Any) -> int | None:
    """The shards a stored layout spans; None when it cannot be read."""
    if isinstance(stored, Exception) or stored is None or layout_problem(stored):
        return None
    return read_layout(stored)[1]


def _is_shard(tag: str, spans: dict[str, int | None]) -> bool:
    """Whether *tag* is a shard's (``<crawl>:<N>``, N as a shard is named: ASCII digits,
    no leading 0) of a crawl of *spans* (crawl -> shards its layout spans, None: unknown)."""
    crawl, _, shard = tag.rpartition(":")
    if crawl not in spans or not (shard.isascii() and shard.isdecimal()):
        return False
    span = spans[crawl]
    if span is None:
        return True
    return (shard == "0" or not shard.startswith("0")) and len(shard) < 6 and int(shard) < span


@dataclass
class Reading:
    """What one read of every crawl found: the numbers of those it read, and why each
    other one could not be read (spider -> reason: a key of another type)."""

    crawls: list[CrawlNumbers] = field(default_factory=list)
    unreadable: dict[str, str] = field(default_factory=dict)


def read_crawls(client: Any, prefix: str, spiders: Iterable[str]) -> list[CrawlNumbers]:
    """Every crawl's numbers (see :func:`read_every_crawl`); those that cannot be read are
    left out."""
    return read_every_crawl(client, prefix, spiders).crawls


def read_every_crawl(client: Any, prefix: str, spiders: Iterable[str]) -> Reading:
    """Every crawl's numbers in one round trip, one more for sharded crawls (their shards
    summed); crawls whose keys are all gone left out. A crawl that cannot be read (a key
    of it of another type) costs itself alone: it is named with the reason, the others
    are read (a connection error still ends the read: it concerns them all)."""
    spiders = list(spiders)
    pipe = pipeline_of(client)
    for spider in spiders:
        k = Keys(prefix, spider)
        _crawl_reads(client, pipe, k)
        pipe.get(k.shard_count)
    replies = pipe.execute(raise_on_error=False)
    reading = Reading()
    for i, spider in enumerate(spiders):
        mine = replies[PER_CRAWL * i : PER_CRAWL * (i + 1)]
        numbers = _one_crawl(client, prefix, spider, mine, reading)
        if numbers is not None and numbers.held:
            reading.crawls.append(numbers)
    return reading


def _one_crawl(
    client: Any, prefix: str, spider: str, replies: list[Any], reading: Reading
) -> CrawlNumbers | None:
    """The numbers of one crawl, or None with the reason it cannot be read in *reading*:
    anything but Redis being down costs that crawl alone (an error no reader foresaw is
    named with its type, and logged with its traceback)."""
    try:
        return _crawl_numbers(client, prefix, spider, replies)
    except UNREADABLE as exc:
        reading.unreadable[spider] = explain_sync(client, prefix, spider, exc).reason
    except REDIS_DOWN_ERRORS:
        raise
    except Exception as exc:
        reading.unreadable[spider] = unforeseen(spider, exc)
    return None


def _crawl_numbers(client: Any, prefix: str, spider: str, replies: list[Any]) -> CrawlNumbers:
    raise_first(replies)
    *mine, layout = replies
    keys = read_layout_keys(prefix, spider, layout)
    if keys.shard is not None:
        return _sharded_numbers(client, keys)
    return _numbers(spider, *mine)


def _crawl_reads(client: Any, pipe: Any, k: Keys) -> None:
    """The reads of one crawl (of one shard), READS replies."""
    keys = counts_keys(k)
    if isinstance(pipe, OneByOne):  # (a cluster's: EVALSHA would need the script loaded)
        pipe.eval(scripts.COUNTS_LUA, len(keys), *keys, "strict")
    else:
        counts = client.register_script(scripts.COUNTS_LUA)
        counts(keys=keys, args=["strict"], client=pipe)  # (garbage named)
    pipe.hgetall(k.stats)
    pipe.hvals(k.gates)
    pipe.exists(k.paused)
    pipe.eval(scripts.ITEMS_STATE_LUA, 2, k.items, k.items_aside)
    pipe.exists(k.pressure)
    pipe.hgetall(k.bloom)
    pipe.get(k.stop)
    pipe.hmget(k.run, *STOP_OVERRIDES)


#: Replies of :func:`_crawl_reads`, and of a crawl's reads in :func:`read_crawls` (its
#: shard count too).
READS = 9
PER_CRAWL = READS + 1


def _sharded_numbers(client: Any, keys: Keys) -> CrawlNumbers:
    """A sharded crawl's numbers: every shard's summed; gates and pause are shard 0's
    (each shard has the same)."""
    shards = keys.every_shard()
    pipe = pipeline_of(client)
    for shard in shards:
        _crawl_reads(client, pipe, shard)
    replies = pipe.execute()
    parts = [
        _numbers(keys.spider, *replies[READS * i : READS * (i + 1)]) for i in range(len(shards))
    ]
    total = merge_stats([p.stats for p in parts])
    items = merged([p.items for p in parts])
    blooms = tuple(b for p in parts for b in p.blooms)
    first = parts[0]  # (gates, pause, stop and back-pressure: every shard has the same)
    return CrawlNumbers(
        total, first.gated_domains, first.paused, first.stopped, items, first.backpressure, blooms
    )


def _numbers(
    spider: str,
    counts: list[Any],
    stats: dict[Any, Any],
    gates: list[Any],
    paused: int,
    items: list[Any],
    pressure: int,
    bloom: dict[Any, Any],
    stop: bytes | None,
    since: list[Any],
) -> CrawlNumbers:
    crawl = CrawlStats.of(spider, Counts.from_reply(counts), counters=counters(stats))
    closed = sum(1 for until in gates if _int_or_zero(until) > crawl.now_ms)
    state = bloom_state(bloom, crawl.now_ms)
    blooms = (state,) if state is not None else ()
    items_state = stream_state(items, stats)
    stopped = stopped_when(stop, since) is not None
    return CrawlNumbers(crawl, closed, bool(paused), stopped, items_state, bool(pressure), blooms)


def _int_or_zero(value: Any) -> int:
    try:
        return int(value)
    except ValueError:
        return 0
