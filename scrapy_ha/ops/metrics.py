"""``scrapy-ha metrics``: a Prometheus exporter of every crawl under a key prefix.

Each scrape reads Redis afresh: the crawl-wide counters the workers' scripts keep in
``<prefix>:{<spider>}:stats`` and the live size of every state, so a crawl counts once however
many workers it has, and a worker that died cannot leave a stale number behind. A scrape while
Redis is unreachable answers at once with ``scrapy_ha_redis_up 0`` (every Redis call has a
timeout, and nothing is retried). The metrics are listed in docs/reference.md.
"""

from __future__ import annotations

__all__ = ["CrawlCollector", "CrawlNumbers", "add_command", "read_crawls", "serve"]

import argparse
import logging
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from scrapy_ha.config.scheduler import key_prefix
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.ops.crawls import CrawlNumbers, discover, read_crawls
from scrapy_ha.store.connection import display_url, sync_redis_from_settings

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.core import Metric
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

#: Port of the exporter: 9410 is unassigned in Prometheus's list of default exporter ports.
DEFAULT_PORT = 9410
#: Address it listens on: local only, unless the operator opens it on purpose.
DEFAULT_ADDR = "127.0.0.1"
#: Seconds one Redis call may take before the scrape gives up and answers ``redis_up 0``:
#: well inside Prometheus's default scrape timeout of 10 s.
DEFAULT_TIMEOUT = 3.0
#: How long the list of crawls is reused before the key space is scanned again: a SCAN walks
#: every key of the database (about 1.5 s for 200,000 keys on a loaded 2-core machine), so
#: not on every scrape at the usual 15 s interval; a new crawl shows up within a minute.
DISCOVERY_TTL = 60.0
#: Counters of the stats hash exported one metric each: (field, metric, help).
COUNTERS = (
    ("enqueued", "enqueued", "Requests added to the queue (duplicates not counted)."),
    ("filtered", "filtered", "Requests refused at enqueue as duplicates."),
    ("acked", "acked", "Requests done: processed completely and removed from Redis."),
    ("reclaimed", "reclaimed", "Leases that expired and went back to pending (worker lost)."),
    ("poison", "poison", "Requests dead-lettered because too many of their leases expired."),
    ("requeued", "requeued", "Dead letters put back in the queue by an operator."),
    ("purged", "purged", "Dead letters deleted by an operator."),
)


class CrawlCollector:
    """A Prometheus collector that reads every crawl under a prefix on each scrape.

    No state is kept between scrapes but the list of crawls (rescanned every
    ``DISCOVERY_TTL`` seconds), so scrapes from several Prometheus servers, and any number
    of workers, give the same numbers."""

    def __init__(self, client: Any, prefix: str, *, discovery_ttl: float = DISCOVERY_TTL):
        self.client = client
        self.prefix = prefix
        self.discovery_ttl = discovery_ttl
        self._lock = threading.Lock()  # scrapes run in threads of their own
        self._spiders: list[str] = []
        self._found_at = float("-inf")
        self._up = True  # logged when it changes, not on every scrape

    def describe(self) -> list[Metric]:
        """Nothing: the metrics depend on what Redis holds, so registering reads nothing."""
        return []

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        up = GaugeMetricFamily(
            "scrapy_ha_redis_up", "1 if the last scrape read Redis, 0 if Redis was unreachable."
        )
        try:
            metrics = self._read()
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
            logger.info("Redis answers again")
        else:
            logger.warning("Redis unreachable, scrapes report scrapy_ha_redis_up 0: %s", exc)

    def _read(self) -> list[Metric]:
        info = {**self.client.info("memory"), **self.client.info("stats")}
        crawls = read_crawls(self.client, self.prefix, self._crawls())
        return [*_redis_metrics(info, len(crawls)), *_crawl_metrics(crawls)]

    def _crawls(self) -> list[str]:
        with self._lock:
            if time.monotonic() - self._found_at > self.discovery_ttl:
                self._spiders = discover(self.client, self.prefix)
                self._found_at = time.monotonic()
            return list(self._spiders)


def _redis_metrics(info: dict[str, Any], crawls: int) -> list[Metric]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    return [
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
        CounterMetricFamily(
            "scrapy_ha_redis_evicted_keys",
            "Keys Redis evicted at maxmemory (INFO evicted_keys): any loses requests.",
            value=int(info.get("evicted_keys", 0)),
        ),
        GaugeMetricFamily("scrapy_ha_crawls", "Crawls found under the key prefix.", value=crawls),
    ]


def _crawl_metrics(crawls: list[CrawlNumbers]) -> list[Metric]:
    return [*_gauges(crawls), *_counters(crawls)]


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
        pressure.add_metric([c.spider], int(c.backpressure))
        error.add_metric([c.spider], c.dupefilter_error)
        lost.add_metric([c.spider], c.false_positives)
    return [requests, workers, fingerprints, gated, paused, pressure, error, lost]


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
        for fclass, n in sorted(c.by_class("retried").items()):
            retried.add_metric([c.spider, fclass], n)
        for fclass, n in sorted(c.by_class("dead").items()):
            dead.add_metric([c.spider, fclass], n)
    return [retried, dead]


def _outcomes(crawls: list[CrawlNumbers]) -> Metric:
    from prometheus_client.core import CounterMetricFamily

    outcomes = CounterMetricFamily(
        "scrapy_ha_retry_outcomes",
        "How retried requests ended: ok (acked after a retry) or dead (dead-lettered after one).",
        labels=["spider", "outcome"],
    )
    for c in crawls:
        outcomes.add_metric([c.spider, "ok"], c.stats.retry_ok)
        outcomes.add_metric([c.spider, "dead"], c.stats.retry_dead)
    return outcomes


def sync_client(settings: BaseSettings, *, timeout: float) -> Any:
    """A blocking Redis client of the crawl's Redis, made the way every scrapy-ha tool makes
    one (any URL form: TLS, Sentinel, Cluster...), whose every call gives up after *timeout*
    seconds and is never retried: a scrape must answer, not wait for Redis."""
    return sync_redis_from_settings(
        settings, connect_timeout=timeout, socket_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )


def _positive(text: str) -> float:
    """A number of seconds above 0 (argparse names the option when this fails)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return seconds


def add_command(sub: Any) -> None:
    """Register ``scrapy-ha metrics`` on the CLI's subparsers."""
    parser = sub.add_parser("metrics", help="serve Prometheus metrics of every crawl")
    parser.set_defaults(serve=serve)
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="default: %(default)s")
    parser.add_argument("--addr", default=DEFAULT_ADDR, help="listen address (%(default)s)")
    parser.add_argument(
        "--timeout",
        type=_positive,
        default=DEFAULT_TIMEOUT,
        help="seconds a Redis call may take before a scrape reports redis_up 0 (%(default)s)",
    )
    parser.add_argument(
        "--rescan",
        type=_positive,
        default=DISCOVERY_TTL,
        help="seconds between two scans of the key space for new crawls (%(default)s)",
    )
    # also accepted after the subcommand, as in `scrapy-ha metrics --prefix ha`
    parser.add_argument("--redis-url", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    parser.add_argument("--prefix", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def serve(args: argparse.Namespace, settings: BaseSettings) -> int:
    """Serve ``/metrics`` until SIGINT or SIGTERM; 2 if the port cannot be bound."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError:
        raise ConfigError(
            "scrapy-ha metrics needs prometheus-client: pip install 'scrapy-ha[metrics]'"
        ) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    prefix = args.prefix or key_prefix(settings)
    if args.redis_url:
        settings.set("REDIS_URL", args.redis_url, priority="cmdline")
    client = sync_client(settings, timeout=args.timeout)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CrawlCollector(client, prefix, discovery_ttl=args.rescan))
    try:
        server, _ = start_http_server(args.port, addr=args.addr, registry=registry)
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {args.addr}:{args.port} ({exc}): pick another --port or --addr"
        ) from None
    print(
        f"serving http://{args.addr}:{server.server_port}/metrics for the crawls under "
        f"{prefix}:* at {display_url(settings)}",
        flush=True,
    )
    _wait_for_signal()
    server.shutdown()
    client.close()
    return 0


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    print("stopped", file=sys.stderr)
