"""The Prometheus exporter of every crawl under a key prefix (``scrapy-ha metrics``, served
by :mod:`scrapy_ha.cli.metrics`).

Each scrape reads Redis afresh: the crawl-wide counters the workers' scripts keep in
``<prefix>:{<spider>}:stats`` and the live size of every state, so a crawl counts once however
many workers it has, and a worker that died cannot leave a stale number behind. A scrape while
Redis is unreachable answers at once with ``scrapy_ha_redis_up 0`` (every Redis call has a
timeout, and nothing is retried). The metrics are listed in docs/reference.md.
"""

from __future__ import annotations

__all__ = ["CrawlCollector", "CrawlNumbers", "read_crawls"]

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import redis

from scrapy_ha.codec.masking import mask_text
from scrapy_ha.ops.crawls import (
    CrawlNumbers,
    KeyNames,
    Reading,
    discover,
    read_crawls,
    read_every_crawl,
)
from scrapy_ha.ops.in_time import within
from scrapy_ha.ops.revisits import revisit_metrics
from scrapy_ha.store.health import primaries_info_sync
from scrapy_ha.verdict import RETRY_CLASSES

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.core import Metric

logger = logging.getLogger(__name__)

#: Counters of the stats hash exported one metric each: (field, metric, help).
COUNTERS = (
    ("enqueued", "enqueued", "Requests added to the queue (duplicates not counted)."),
    ("filtered", "filtered", "Links of pages refused at enqueue as duplicates."),
    (
        "start_duplicates",
        "start_duplicates",
        "Start (or pushed) requests the crawl had queued already: another worker's.",
    ),
    ("acked", "acked", "Requests done: processed completely and removed from Redis."),
    ("reclaimed", "reclaimed", "Leases that expired and went back to pending (worker lost)."),
    ("poison", "poison", "Requests dead-lettered because too many of their leases expired."),
    ("requeued", "requeued", "Dead letters put back in the queue by an operator."),
    ("purged", "purged", "Dead letters deleted by an operator."),
    ("items", "items_committed", "Items committed to the item stream with their page's ack."),
    ("items_refused", "items_refused", "Items not committed: their page's lease had expired."),
)
#: The classes a retry can have, exposed at 0 from a crawl's first scrape: Prometheus's
#: increase() and rate() count nothing of a series' first sample, so a class whose series
#: was born at its first non-zero value hid it (45 pages gone at once counted 2, and
#: ScrapyHADeadLettersGrowing stayed quiet).
RETRIED_CLASSES = tuple(c.value for c in RETRY_CLASSES)
#: The same for dead letters: the retry classes and the scheduler's own (a lease expired too
#: often, a child that could not be stored, an entry that cannot be read back or whose URL
#: scheme is refused, a failure the worker could not judge).
DEAD_CLASSES = (*RETRIED_CLASSES, "poison", "unstorable", "corrupt", "refused", "error")


class CrawlCollector:
    """A Prometheus collector that reads every crawl under a prefix on each scrape.

    No state is kept between scrapes but the list of crawls (rescanned every
    *discovery_ttl* seconds: ``scrapy-ha metrics --rescan``), so scrapes from several
    Prometheus servers, and any number of workers, give the same numbers."""

    def __init__(
        self,
        client: Any,
        prefix: str,
        *,
        discovery_ttl: float,
        where: str | None = None,
        timeout: float | None = None,
    ):
        self.client = client
        self.timeout = timeout  # of a scrape in all (--timeout), each call's being its own
        self.prefix = prefix
        self.where = f"Redis at {where}" if where else "Redis"  # masked: named in the log
        self.discovery_ttl = discovery_ttl
        self._lock = threading.Lock()  # scrapes run in threads of their own
        self._spiders: list[str] = []
        self._found_at = float("-inf")
        self._up = True  # logged when it changes, not on every scrape
        self._unreadable: dict[str, str] = {}  # the same, crawl by crawl
        self._names = KeyNames(prefix)  # a key name that is not UTF-8: logged once
        self._evicted: dict[str, int] = {}  # a cluster's primaries' last evicted_keys

    def describe(self) -> list[Metric]:
        """Every family a scrape can give, made from no crawl (registering reads nothing
        from Redis): a scrape that names the families it wants (``/metrics?name[]=...``)
        is given those, where it was given nothing."""
        return [
            _up(),
            *_redis_metrics({"evicted_keys": 0}, 0),
            _read_errors([], {}),
            *_crawl_metrics([]),
            *revisit_metrics(self.client, self.prefix, Reading()),
        ]

    def collect(self) -> Iterator[Metric]:
        up = _up()
        try:
            metrics = within(self.timeout, self._read)
        except redis.exceptions.RedisError as exc:
            self._log_up(False, exc)
            up.add_metric([], 0)
            yield up
            return
        self._log_up(True)
        up.add_metric([], 1)
        yield up
        yield from metrics

    def _log_up(self, up: bool, exc: Exception | None = None) -> None:
        if up == self._up:
            return
        self._up = up
        if up:
            logger.info("%s answers again", self.where)
        else:
            logger.warning(
                "%s unreachable, scrapes report scrapy_ha_redis_up 0: %s",
                self.where,
                mask_text(str(exc)),
            )

    def _read(self) -> list[Metric]:
        try:
            memory, stats = (primaries_info_sync(self.client, s) for s in ("memory", "stats"))
        except redis.exceptions.NoPermissionError:  # INFO refused to this user: the crawls'
            memory = stats = {}  # series without Redis's (a QA run: redis_up 0, nothing else)
        info = _fullest(memory, stats, self._evicted) if memory else {}
        reading = read_every_crawl(self.client, self.prefix, self._crawls())
        continuous = revisit_metrics(self.client, self.prefix, reading)
        crawls = [c for c in reading.crawls if c.spider not in reading.unreadable]
        self._log_unreadable(reading.unreadable)
        found = len(crawls) + len(reading.unreadable)
        return [
            *_redis_metrics(info, found),
            _read_errors(crawls, reading.unreadable),
            *_crawl_metrics(crawls),
            *continuous,
        ]

    def _log_unreadable(self, unreadable: dict[str, str]) -> None:
        """Log a crawl that could not be read when it first could not (with why), and when
        it reads again: not on every scrape."""
        for spider, reason in sorted(unreadable.items()):
            if self._unreadable.get(spider) != reason:
                logger.warning(
                    "cannot read the crawl %s, its series are left out "
                    "(scrapy_ha_crawl_read_error 1): %s",
                    spider,
                    reason,
                )
        for spider in sorted(set(self._unreadable) - set(unreadable)):
            logger.info("the crawl %s reads again", spider)
        self._unreadable = dict(unreadable)

    def _crawls(self) -> list[str]:
        with self._lock:
            if time.monotonic() - self._found_at > self.discovery_ttl:
                self._spiders = discover(self.client, self.prefix, self._names)
                self._found_at = time.monotonic()
            return list(self._spiders)


def _up() -> Any:
    from prometheus_client.core import GaugeMetricFamily

    return GaugeMetricFamily(
        "scrapy_ha_redis_up",
        "1 if the last scrape read Redis, 0 if Redis was unreachable or slower than --timeout.",
    )


def _fullest(
    memory: dict[str, Any], stats: dict[str, Any], evicted: dict[str, int]
) -> dict[str, Any]:
    """INFO memory and stats of the server, or of a Redis Cluster's primary nearest its
    ``maxmemory`` (the first to refuse writes, and to hold the workers back), with the keys
    every primary evicted (*evicted*: each primary's last count, kept while one cannot be
    read: the counter never goes down); no memory figures when no primary could be read."""
    if "used_memory" in memory:
        return {**memory, **stats}
    nodes: list[dict[str, Any]] = [
        {**v, **(stats.get(n) or {})} for n, v in memory.items() if isinstance(v, dict)
    ]
    for name, node_stats in stats.items():
        if isinstance(node_stats, dict) and "evicted_keys" in node_stats:
            evicted[name] = int(node_stats["evicted_keys"])
    if not nodes:  # (no memory series then: none is better than a false 0)
        return {"evicted_keys": sum(evicted.values())}

    def fill(node: dict[str, Any]) -> tuple[float, int]:
        used, most = int(node.get("used_memory", 0)), int(node.get("maxmemory", 0))
        return (used / most if most else 0.0), used

    fullest = max(nodes, key=fill)
    return {**fullest, "evicted_keys": sum(evicted.values())}


def _redis_metrics(info: dict[str, Any], crawls: int) -> list[Metric]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    memory = [
        GaugeMetricFamily(
            "scrapy_ha_redis_memory_used_bytes",
            "Memory Redis uses (INFO used_memory).",
            value=int(info.get("used_memory", 0)),
        ),
        GaugeMetricFamily(
            "scrapy_ha_redis_memory_max_bytes",
            "Redis's maxmemory (0: no limit set).",
            value=int(info.get("maxmemory", 0)),
        ),
    ]
    evicted = CounterMetricFamily(
        "scrapy_ha_redis_evicted_keys",
        "Keys Redis evicted at maxmemory (INFO evicted_keys): any loses requests.",
        value=int(info.get("evicted_keys", 0)),
    )
    return [
        *(memory if "used_memory" in info else ()),
        *((evicted,) if "evicted_keys" in info else ()),  # (none: INFO refused to the user)
        GaugeMetricFamily("scrapy_ha_crawls", "Crawls found under the key prefix.", value=crawls),
    ]


def _read_errors(crawls: list[CrawlNumbers], unreadable: dict[str, str]) -> Metric:
    errors = _gauge(
        "scrapy_ha_crawl_read_error",
        "1 if a key of the crawl could not be read at this scrape (another type than "
        "scrapy-ha writes: the exporter's log names it), its other series left out; else 0.",
    )
    for c in crawls:
        errors.add_metric([c.spider], 0)
    for spider in sorted(unreadable):
        errors.add_metric([spider], 1)
    family: Metric = errors
    return family


def _crawl_metrics(crawls: list[CrawlNumbers]) -> list[Metric]:
    return [*_gauges(crawls), *_counters(crawls), *_items(crawls)]


def _items(crawls: list[CrawlNumbers]) -> list[Metric]:
    """The item stream (HA_ITEMS = "outbox"): its length, and each sink's group."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    length = _gauge(
        "scrapy_ha_items_in_stream",
        "Items in the stream: from the oldest one some sink has not acknowledged on.",
    )
    backlog = GaugeMetricFamily(
        "scrapy_ha_items_backlog",
        "Items a sink (a consumer group) has not committed yet: pending plus not delivered.",
        labels=["spider", "group"],
    )
    consumed = CounterMetricFamily(
        "scrapy_ha_items_consumed",
        "Items a sink (a consumer group) committed and acknowledged.",
        labels=["spider", "group"],
    )
    aside = CounterMetricFamily(
        "scrapy_ha_items_aside",
        "Items a sink (a consumer group) ever set aside in ha:{S}:items_aside (--retry-aside "
        "does not lower it; scrapy_ha_items_aside_waiting: the records there now).",
        labels=["spider", "group"],
    )
    waiting = _gauge(
        "scrapy_ha_items_aside_waiting",
        "Set-aside records waiting in ha:{S}:items_aside, every sink's (--retry-aside deletes "
        "those it wrote).",
    )
    for c in crawls:
        length.add_metric([c.spider], c.items.length)
        waiting.add_metric([c.spider], c.items.aside)
        for g in c.items.groups:
            backlog.add_metric([c.spider, g.name], g.backlog)
            consumed.add_metric([c.spider, g.name], g.consumed)
            aside.add_metric([c.spider, g.name], g.set_aside)
    return [length, backlog, consumed, aside, waiting]


def _gauges(crawls: list[CrawlNumbers]) -> list[Metric]:
    from prometheus_client.core import GaugeMetricFamily

    requests = GaugeMetricFamily(
        "scrapy_ha_requests",
        "Requests in each state: pending, leased (being processed), delayed (waiting to be "
        "retried), dead (in the dead-letter queue).",
        labels=["spider", "state"],
    )
    workers = _gauge("scrapy_ha_workers", "Live workers (heartbeat not expired).")
    fingerprints = _gauge("scrapy_ha_fingerprints", "Request fingerprints in the dupefilter.")
    gated = _gauge("scrapy_ha_gated_domains", "Domains held by a gate (429, Retry-After) now.")
    paused = _gauge("scrapy_ha_paused", "1 while an operator paused the crawl (scrapy-ha pause).")
    stopped = _gauge(
        "scrapy_ha_stopped",
        "1 while the crawl is stopped (scrapy-ha stop) and no worker runs it: a worker "
        "started now resumes it.",
    )
    pressure = _gauge(
        "scrapy_ha_backpressure",
        "1 while Redis's memory is above HA_REDIS_MEMORY_HIGH: workers lease nothing new.",
    )
    error = _gauge(
        "scrapy_ha_dupefilter_error_rate",
        "Chance now that the Bloom filter takes a new URL for a seen one (never crawled); "
        "0 for the exact set.",
    )
    lost = _gauge(
        "scrapy_ha_dupefilter_false_positives",
        "URLs the Bloom filter took for seen ones so far, never crawled (expected: an estimate).",
    )
    for c in crawls:
        for state, n in c.states.items():
            requests.add_metric([c.spider, state], n)
        workers.add_metric([c.spider], c.stats.workers)
        fingerprints.add_metric([c.spider], c.stats.fingerprints)
        gated.add_metric([c.spider], c.gated_domains)
        paused.add_metric([c.spider], int(c.paused))
        stopped.add_metric([c.spider], int(c.stopped and not c.stats.workers))
        pressure.add_metric([c.spider], int(c.backpressure))
        error.add_metric([c.spider], c.dupefilter_error)
        lost.add_metric([c.spider], c.false_positives)
    return [requests, workers, fingerprints, gated, paused, stopped, pressure, error, lost]


def _gauge(name: str, documentation: str) -> Any:
    from prometheus_client.core import GaugeMetricFamily

    return GaugeMetricFamily(name, documentation, labels=["spider"])


def _counters(crawls: list[CrawlNumbers]) -> list[Metric]:
    from prometheus_client.core import CounterMetricFamily

    plain = []
    for stat, name, documentation in COUNTERS:
        family = CounterMetricFamily(f"scrapy_ha_{name}", documentation, labels=["spider"])
        for c in crawls:
            family.add_metric([c.spider], c.stats.counter(stat))
        plain.append(family)
    return [*plain, *_class_counters(crawls), _outcomes(crawls)]


def _class_counters(crawls: list[CrawlNumbers]) -> list[Metric]:
    from prometheus_client.core import CounterMetricFamily

    retried = CounterMetricFamily(
        "scrapy_ha_retried", "Retries scheduled, per failure class.", labels=["spider", "class"]
    )
    dead = CounterMetricFamily(
        "scrapy_ha_dead_lettered",
        "Requests dead-lettered, per failure class.",
        labels=["spider", "class"],
    )
    for c in crawls:
        for fclass, n in sorted(_every_class(c.by_class("retried"), RETRIED_CLASSES).items()):
            retried.add_metric([c.spider, fclass], n)
        for fclass, n in sorted(_every_class(c.by_class("dead"), DEAD_CLASSES).items()):
            dead.add_metric([c.spider, fclass], n)
    return [retried, dead]


def _every_class(counted: dict[str, int], known: tuple[str, ...]) -> dict[str, int]:
    """*counted* with every class of *known* it lacks at 0 (see :data:`RETRIED_CLASSES`)."""
    return {**dict.fromkeys(known, 0), **counted}


def _outcomes(crawls: list[CrawlNumbers]) -> Metric:
    from prometheus_client.core import CounterMetricFamily

    outcomes = CounterMetricFamily(
        "scrapy_ha_retry_outcomes",
        "How retried requests ended: ok (acked after a retry) or dead (dead-lettered "
        "after one, or a revisit's visit that failed after one).",
        labels=["spider", "outcome"],
    )
    for c in crawls:
        outcomes.add_metric([c.spider, "ok"], c.stats.retry_ok)
        outcomes.add_metric([c.spider, "dead"], c.stats.retry_dead)
    return outcomes
