"""Every setting scrapy-ha reads: one frozen ``*Config.from_settings`` per component.

Each default is a constant here (or beside the rule it belongs to) with the reason for its
value; each value is checked by the helpers of :mod:`scrapy_ha.config.validate`, so a bad one fails
at start naming the setting, the value and what it must be. No other module reads an
``HA_*`` setting.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scrapy_ha.codec import CODEC_CLASSES_SETTING, DEFAULT_ALLOWED_SCHEMES, UNSTORABLE_POLICIES
from scrapy_ha.config import validate as check
from scrapy_ha.config.continuous import RevisitConfig, dupefilter_ttl
from scrapy_ha.config.deadletters import (  # the dead-letter queue's settings, re-exported
    DEFAULT_DLQ_MAX_AGE_MS,
    DEFAULT_DLQ_MAX_ENTRIES,
    DEFAULT_DLQ_WARN_THRESHOLD,
    DeadLetterConfig,
)
from scrapy_ha.config.items import DEFAULT_ITEMS, items_mode
from scrapy_ha.config.memory import MemoryConfig
from scrapy_ha.config.middlewares import allowed_schemes
from scrapy_ha.config.politeness import Politeness
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.keys import DEFAULT_PREFIX

if TYPE_CHECKING:
    from typing import Self

    from scrapy.settings import BaseSettings

__all__ = [
    "DEFAULT_DLQ_MAX_AGE_MS",
    "DEFAULT_DLQ_MAX_ENTRIES",
    "DEFAULT_DLQ_WARN_THRESHOLD",
    "DeadLetterConfig",
    "SchedulerConfig",
]

#: Lease length: a slow page and its pipelines fit; a dead worker's requests come back within
#: a minute (BullMQ locks jobs for 30 s too).
DEFAULT_LEASE_TIME = 30.0
#: Renewal interval: a third of the lease, so two renewals may fail before it expires.
DEFAULT_RENEW_INTERVAL = 10.0
#: Worker heartbeat TTL: as long as a lease, so a worker counts as alive exactly as long as its
#: leases would.
DEFAULT_HEARTBEAT_TTL = 30.0
#: Reclaim scan interval and batch: an expired lease waits at most 10 s more; the batch bounds
#: one script's run time.
DEFAULT_RECLAIM_INTERVAL = 10.0
DEFAULT_RECLAIM_BATCH = 100
#: The bounds of the reclaim's settings (see SchedulerConfig.validate).
MIN_RECLAIM_INTERVAL = 0.001
MAX_RECLAIM_BATCH = 1_000_000
#: Lease expiries before a request is poison: Sidekiq Pro kills a job after 3 crashes.
DEFAULT_MAX_LEASE_EXPIRIES = 3
#: Scrapy's CONCURRENT_REQUESTS default: what the prefetch follows unless HA_PREFETCH is set.
SCRAPY_CONCURRENT_REQUESTS = 16
#: Requests handed to the engine and not finished, per CONCURRENT_REQUESTS: the downloads
#: plus as many responses waiting in the scraper. Bounds what a killed worker re-crawls.
INFLIGHT_PER_CONCURRENT_REQUEST = 2
#: Finished requests whose ack (or retry, or dead letter) is on its way to Redis, per
#: CONCURRENT_REQUESTS, beyond HA_MAX_INFLIGHT: one round's acks. Past them the engine waits
#: for that round: requests finish and are replaced while a round is out, so without a cap
#: their leases pile up for as long as the round takes (80 held at 16 concurrent requests,
#: against 64, on a busy 2-core machine). Bounds what a killed worker leaves to redo.
ACKS_PER_CONCURRENT_REQUEST = 1
#: Seconds the whole crawl must stay empty before a worker closes (covers a sibling's last acks).
DEFAULT_IDLE_TIMEOUT = 5.0
#: Seconds to wait for Redis at open: long enough for a busy server, short enough to fail clearly.
DEFAULT_CONNECT_TIMEOUT = 5.0
#: Seconds a starting worker waits for a Redis that does not answer, trying again as a
#: running worker does: a Sentinel failover or a restart from the AOF takes seconds, a
#: managed service's failover up to a minute (scrapyd starts jobs at any moment).
DEFAULT_START_TIMEOUT = 60.0
#: Cap of the reconnect backoff when Redis goes away mid-crawl.
DEFAULT_RECONNECT_MAX_DELAY = 10.0
#: Seconds a closing worker gives Redis to take back what it holds (its last acks and
#: children, its leases): a busy Redis takes a last flush of thousands of acks well within
#: it; past it the leases expire (HA_LEASE_TIME) and are reclaimed, nothing is lost.
DEFAULT_CLOSE_TIMEOUT = 10.0
#: Longest wait of the background loop between two rounds when nothing wakes it.
DEFAULT_TICK = 0.25
#: The longest ``HA_TICK``: the loop notices an idle crawl, a pause or a stop at this pace
#: (a QA worker with 1e8 never closed); a minute leaves room to show that events, not the
#: tick, drive the loop (``tests/test_session_wakes.py``).
MOST_TICK = 60.0
#: Seconds between two sweeps of the asyncio reactor's cancelled timers (see
#: scrapy_ha.scheduler.session.heap):
#: often enough that a second's cancelled download timeouts are all it ever holds.
DEFAULT_TIMER_SWEEP = 1.0
#: A fresh GET downloads while the round that stores it is on its way (the round trip overlaps
#: it): a killed worker holds no more leases than without (tests/test_crash.py, 40 runs).
DEFAULT_EARLY_DOWNLOAD = True
#: Start URLs moved from the scrapy-redis list per round.
DEFAULT_START_URLS_BATCH = 100
#: A child that cannot be stored fails its parent: a loud error, never a silent loss.
DEFAULT_UNSTORABLE = "error"
#: DUPEFILTER_CLASS values that mean "filter duplicates" (done in Redis, by fingerprint).
DEDUPING_FILTERS = ("scrapy.dupefilters.RFPDupeFilter", "scrapy_redis.dupefilter.RFPDupeFilter")
#: The DUPEFILTER_CLASS that switches deduplication off, as in Scrapy.
NO_FILTER = "scrapy.dupefilters.BaseDupeFilter"
#: scrapy-redis's start URLs key.
DEFAULT_START_URLS_KEY = "%(name)s:start_urls"
#: Lease periods a stuck event loop keeps its leases renewed by the thread (HA_RENEW_WATCHDOG):
#: long enough for a slow callback or a database that hangs, short of holding work forever.
DEFAULT_WATCHDOG_LEASE_PERIODS = 10
#: Orders within one priority (``HA_QUEUE_ORDER``); Scrapy's default queues are LIFO.
QUEUE_ORDERS = ("lifo", "fifo")


@dataclass(frozen=True)
class SchedulerConfig:
    """Everything the scheduler reads from settings, validated."""

    key_prefix: str = DEFAULT_PREFIX
    lease_time: float = DEFAULT_LEASE_TIME
    renew_interval: float = DEFAULT_RENEW_INTERVAL
    heartbeat_ttl: float = DEFAULT_HEARTBEAT_TTL
    reclaim_interval: float = DEFAULT_RECLAIM_INTERVAL
    reclaim_batch: int = DEFAULT_RECLAIM_BATCH
    max_lease_expiries: int = DEFAULT_MAX_LEASE_EXPIRIES
    prefetch: int = SCRAPY_CONCURRENT_REQUESTS
    max_inflight: int = INFLIGHT_PER_CONCURRENT_REQUEST * SCRAPY_CONCURRENT_REQUESTS
    #: requests handed to the engine whose lease Redis still holds: unfinished (at most
    #: max_inflight), or finished with their ack on its way (HA_MAX_INFLIGHT + one round of
    #: acks, ACKS_PER_CONCURRENT_REQUEST)
    max_unacked: int = (
        INFLIGHT_PER_CONCURRENT_REQUEST + ACKS_PER_CONCURRENT_REQUEST
    ) * SCRAPY_CONCURRENT_REQUESTS
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    feed: bool = False
    persist: bool = False
    flush_on_start: bool = False
    dedupe_start_requests: bool = True
    #: freeze the start-up heap out of the garbage collector's passes
    #: (scrapy_ha.scheduler.session.heap)
    gc_freeze: bool = True
    #: seconds between two runs of a no-op Twisted timer (0: none; scrapy_ha.scheduler.session.heap)
    timer_sweep: float = DEFAULT_TIMER_SWEEP
    #: a fresh GET may download before Redis's verdict (scrapy_ha.scheduler.gate.EarlyGuard)
    early_download: bool = DEFAULT_EARLY_DOWNLOAD
    #: HA_ITEMS: "outbox" commits a page's items with its ack (scrapy_ha.scheduler.items)
    items: str = DEFAULT_ITEMS
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    start_timeout: float = DEFAULT_START_TIMEOUT
    reconnect_max_delay: float = DEFAULT_RECONNECT_MAX_DELAY
    close_timeout: float = DEFAULT_CLOSE_TIMEOUT
    tick: float = DEFAULT_TICK
    start_urls_key: str = DEFAULT_START_URLS_KEY
    start_urls_batch: int = DEFAULT_START_URLS_BATCH
    start_urls_as_set: bool = False
    worker_id: str = ""
    unstorable: str = DEFAULT_UNSTORABLE
    #: schemes of the requests this worker fetches from Redis or queues (HA_ALLOWED_SCHEMES)
    allowed_schemes: frozenset[str] = DEFAULT_ALLOWED_SCHEMES
    dedupe: bool = True
    #: seconds a seen URL stays seen (HA_DUPEFILTER_TTL; 0: for ever, lua/lib/aged.lua)
    dupefilter_ttl: float = 0.0
    dupefilter_debug: bool = False
    order: str = QUEUE_ORDERS[0]
    #: SCHEDULER_PRIORITY_QUEUE is DownloaderAwarePriorityQueue: hand out from the least
    #: busy download slot first, as it does, rather than in global priority order.
    slot_fair: bool = False
    #: order of start requests in their own queue, after the others of their priority
    #: (SCHEDULER_START_MEMORY_QUEUE); "": they share the others' order
    start_order: str = "fifo"
    renew_watchdog: float = DEFAULT_WATCHDOG_LEASE_PERIODS * DEFAULT_LEASE_TIME
    #: HA_WORKER_ID was set: the worker id is the user's, not one made up at start.
    worker_id_given: bool = False
    #: HA_FEED was set (True or False); unset, the spider decides (a RedisSpider feeds).
    feed_given: bool = False
    dead_letter: DeadLetterConfig = field(default_factory=lambda: DeadLetterConfig())
    #: crawl-wide per-domain limits (HA_DOMAIN_RATE, HA_DOMAIN_CONCURRENCY, HA_DOMAIN_LIMITS)
    politeness: Politeness = field(default_factory=lambda: Politeness())
    #: the dupefilter (HA_DUPEFILTER*) and the back-pressure marks (HA_REDIS_MEMORY_*)
    memory: MemoryConfig = field(default_factory=lambda: MemoryConfig())
    #: revisits (HA_REVISIT, HA_REVISIT_ADAPTIVE, HA_REVISIT_MIN, HA_REVISIT_MAX)
    revisit: RevisitConfig = field(default_factory=lambda: RevisitConfig())

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        """Read and validate the ``HA_*`` settings (and scrapy-redis's own)."""
        # 0 is "no limit" to Scrapy: the prefetch then follows Scrapy's default
        concurrency = (
            check.whole(settings, "CONCURRENT_REQUESTS", SCRAPY_CONCURRENT_REQUESTS, minimum=0)
            or SCRAPY_CONCURRENT_REQUESTS
        )
        prefetch = check.whole(settings, "HA_PREFETCH", concurrency)
        max_inflight = check.whole(
            settings, "HA_MAX_INFLIGHT", INFLIGHT_PER_CONCURRENT_REQUEST * concurrency
        )
        config = cls(
            key_prefix=check.text(settings, "HA_KEY_PREFIX", DEFAULT_PREFIX),
            lease_time=check.seconds(settings, "HA_LEASE_TIME", DEFAULT_LEASE_TIME),
            renew_interval=check.seconds(
                settings, "HA_LEASE_RENEW_INTERVAL", DEFAULT_RENEW_INTERVAL
            ),
            heartbeat_ttl=check.seconds(settings, "HA_HEARTBEAT_TTL", DEFAULT_HEARTBEAT_TTL),
            reclaim_interval=check.seconds(
                settings, "HA_RECLAIM_INTERVAL", DEFAULT_RECLAIM_INTERVAL
            ),
            reclaim_batch=check.whole(  # (1e19: every reclaim refused by Redis)
                settings,
                "HA_RECLAIM_BATCH",
                DEFAULT_RECLAIM_BATCH,
                maximum=MAX_RECLAIM_BATCH,
                why=" (expired leases taken back by one call, which holds Redis meanwhile)",
            ),
            max_lease_expiries=check.whole(
                settings, "HA_MAX_LEASE_EXPIRIES", DEFAULT_MAX_LEASE_EXPIRIES
            ),
            prefetch=prefetch,
            max_inflight=max_inflight,
            max_unacked=max_inflight + ACKS_PER_CONCURRENT_REQUEST * concurrency,
            idle_timeout=check.seconds(
                settings, "HA_IDLE_TIMEOUT", DEFAULT_IDLE_TIMEOUT, zero=True
            ),
            feed=check.boolean(settings, "HA_FEED", False),
            persist=check.boolean(settings, "SCHEDULER_PERSIST", False, theirs=True),
            flush_on_start=check.boolean(settings, "SCHEDULER_FLUSH_ON_START", False, theirs=True),
            dedupe_start_requests=check.boolean(settings, "HA_DEDUPE_START_REQUESTS", True),
            gc_freeze=check.boolean(settings, "HA_GC_FREEZE", True),
            timer_sweep=check.seconds(settings, "HA_TIMER_SWEEP", DEFAULT_TIMER_SWEEP, zero=True),
            early_download=check.boolean(settings, "HA_EARLY_DOWNLOAD", DEFAULT_EARLY_DOWNLOAD),
            items=items_mode(settings),
            connect_timeout=check.seconds(settings, "HA_CONNECT_TIMEOUT", DEFAULT_CONNECT_TIMEOUT),
            # 0: one attempt, no waiting
            start_timeout=check.seconds(
                settings, "HA_START_TIMEOUT", DEFAULT_START_TIMEOUT, zero=True
            ),
            reconnect_max_delay=check.seconds(
                settings, "HA_RECONNECT_MAX_DELAY", DEFAULT_RECONNECT_MAX_DELAY
            ),
            close_timeout=check.seconds(settings, "HA_CLOSE_TIMEOUT", DEFAULT_CLOSE_TIMEOUT),
            tick=check.seconds(settings, "HA_TICK", DEFAULT_TICK, most=MOST_TICK),
            start_urls_key=check.text(settings, "REDIS_START_URLS_KEY", DEFAULT_START_URLS_KEY),
            start_urls_batch=check.whole(
                settings, "REDIS_START_URLS_BATCH_SIZE", DEFAULT_START_URLS_BATCH
            ),
            start_urls_as_set=check.boolean(
                settings, "REDIS_START_URLS_AS_SET", False, theirs=True
            ),
            worker_id=check.text(settings, "HA_WORKER_ID", "") or default_worker_id(),
            worker_id_given=bool(settings.get("HA_WORKER_ID")),
            feed_given=check.given(settings, "HA_FEED"),
            dead_letter=DeadLetterConfig.from_settings(settings),
            politeness=Politeness.from_settings(settings),
            memory=MemoryConfig.from_settings(settings),
            revisit=RevisitConfig.from_settings(settings),
            unstorable=check.choice(
                settings, "HA_UNSTORABLE", DEFAULT_UNSTORABLE, UNSTORABLE_POLICIES
            ),
            allowed_schemes=allowed_schemes(settings),
            dedupe=_dedupe(settings),
            dupefilter_ttl=dupefilter_ttl(settings),
            dupefilter_debug=check.boolean(settings, "DUPEFILTER_DEBUG", False, theirs=True),
            order=queue_order(settings),
            slot_fair=slot_fair(settings),
            start_order=start_queue_order(settings),
            renew_watchdog=check.seconds(
                settings,
                "HA_RENEW_WATCHDOG",
                DEFAULT_WATCHDOG_LEASE_PERIODS
                * check.seconds(settings, "HA_LEASE_TIME", DEFAULT_LEASE_TIME),
            ),
        )
        _refuse_jobdir(settings)
        check.codec_classes(settings, CODEC_CLASSES_SETTING)
        config.validate()
        return config

    def validate(self) -> None:
        """Check combinations of settings; raise :class:`ConfigError`."""
        if self.reclaim_interval < MIN_RECLAIM_INTERVAL:  # (the reclaim's lock: SET PX 0)
            raise ConfigError(
                f"HA_RECLAIM_INTERVAL={self.reclaim_interval!r} must be at least "
                f"{MIN_RECLAIM_INTERVAL:g} seconds (Redis keeps a TTL in whole milliseconds)"
            )
        if self.renew_interval >= self.lease_time:
            raise ConfigError(
                f"HA_LEASE_RENEW_INTERVAL={self.renew_interval} must be shorter than "
                f"HA_LEASE_TIME={self.lease_time}, or leases expire before they are renewed "
                f"(a third of the lease is a good value)"
            )
        if self.heartbeat_ttl <= self.renew_interval:
            raise ConfigError(
                f"HA_HEARTBEAT_TTL={self.heartbeat_ttl} must be longer than "
                f"HA_LEASE_RENEW_INTERVAL={self.renew_interval}: heartbeats are sent at "
                f"each renewal"
            )
        check_key_prefix(self.key_prefix)


def key_prefix(settings: BaseSettings) -> str:
    """``HA_KEY_PREFIX``, checked as the scheduler checks it (for tools that only need it)."""
    prefix = check.text(settings, "HA_KEY_PREFIX", DEFAULT_PREFIX)
    check_key_prefix(prefix)
    return prefix


def check_key_prefix(prefix: str) -> None:
    """Refuse *prefix* (``HA_KEY_PREFIX``, ``--prefix``): keys are ``<prefix>:{<spider>}:...``:
    braces would move the hash tag, spaces and control characters break the CLI's patterns
    and its output (pattern characters are escaped where a pattern is made)."""
    if not prefix or any(c in prefix for c in "{} ") or not prefix.isprintable():
        raise ConfigError(
            f"HA_KEY_PREFIX={prefix!r} must be non-empty, printable, without spaces or braces"
        )


def queue_order(settings: BaseSettings) -> str:
    """Order within a priority: ``HA_QUEUE_ORDER``, else Scrapy's queue settings (a Fifo
    memory or disk queue means FIFO), else Scrapy's default, LIFO (depth-first)."""
    order = settings.get("HA_QUEUE_ORDER")
    if order is not None:
        if str(order).lower() not in QUEUE_ORDERS:
            raise ConfigError(f"HA_QUEUE_ORDER={order!r} must be 'lifo' or 'fifo'")
        return str(order).lower()
    queues = ("SCHEDULER_MEMORY_QUEUE", "SCHEDULER_DISK_QUEUE")
    names = [check.queue_name(settings, name) for name in queues]
    return "fifo" if any("fifo" in name.lower() for name in names) else "lifo"


def start_queue_order(settings: BaseSettings) -> str:
    """Order of start requests: Scrapy keeps them in queues of their own
    (``SCHEDULER_START_MEMORY_QUEUE``, FIFO by default) behind other requests of the same
    priority; "lifo" when that names a Lifo queue, "" (one shared order) when it is None or
    empty, as in Scrapy. ``SCHEDULER_START_DISK_QUEUE`` is not read: Scrapy reads it only
    under ``JOBDIR``, which scrapy-ha refuses."""
    name = check.queue_name(settings, "SCHEDULER_START_MEMORY_QUEUE")
    if not name:
        return ""
    return "lifo" if "lifo" in name.lower() else "fifo"


#: Scrapy's priority queue that picks the least busy download slot (its pqueues module).
DOWNLOADER_AWARE_QUEUE = "scrapy.pqueues.DownloaderAwarePriorityQueue"


def slot_fair(settings: BaseSettings) -> bool:
    """Is ``SCHEDULER_PRIORITY_QUEUE`` Scrapy's DownloaderAwarePriorityQueue (its path, the
    class, or a subclass)? Any other value keeps the global priority order, as Scrapy's
    default ScrapyPriorityQueue."""
    if settings.get("SCHEDULER_PRIORITY_QUEUE") == DOWNLOADER_AWARE_QUEUE:
        return True
    from scrapy.pqueues import DownloaderAwarePriorityQueue

    cls = check.queue_class(settings, "SCHEDULER_PRIORITY_QUEUE")
    return cls is not None and issubclass(cls, DownloaderAwarePriorityQueue)


def default_worker_id(job: str | None = None) -> str:
    """``host:pid[:job]:random``: *job* defaults to the scrapyd job id (``SCRAPY_JOB``)."""
    job = job or os.environ.get("SCRAPY_JOB")
    tag = uuid.uuid4().hex[:6]
    base = f"{socket.gethostname()}:{os.getpid()}"
    return f"{base}:{job}:{tag}" if job else f"{base}:{tag}"


def _dedupe(settings: BaseSettings) -> bool:
    """DUPEFILTER_CLASS: Scrapy's or scrapy-redis's filter means Redis's, BaseDupeFilter off."""
    value = settings.get("DUPEFILTER_CLASS") or DEDUPING_FILTERS[0]
    if not isinstance(value, (str, type)):
        raise ConfigError(f"DUPEFILTER_CLASS={value!r} is not a class (a dotted path to one)")
    name = value if isinstance(value, str) else f"{value.__module__}.{value.__qualname__}"
    if name in DEDUPING_FILTERS or name == NO_FILTER:
        return name != NO_FILTER
    raise ConfigError(
        f"DUPEFILTER_CLASS={name!r} cannot be used with scrapy_ha.Scheduler: duplicates are "
        f"filtered in Redis, by the request fingerprint, for every worker. Remove the "
        f"setting (or use {DEDUPING_FILTERS[0]!r}), use {NO_FILTER!r} to switch "
        f"deduplication off, and set REQUEST_FINGERPRINTER_CLASS to change what counts "
        f"as a duplicate"
    )


def _refuse_jobdir(settings: BaseSettings) -> None:
    if settings.get("JOBDIR"):
        raise ConfigError(
            f"JOBDIR={settings.get('JOBDIR')!r} cannot be used with scrapy_ha.Scheduler: "
            f"the queue and the dupefilter live in Redis, where a stopped crawl resumes by "
            f"itself (SCHEDULER_PERSIST=True keeps them after the crawl). Remove JOBDIR "
            f"(for example `-s JOBDIR=`; under scrapyd, leave `jobs_dir` unset in "
            f"scrapyd.conf: scrapyd gives every job a JOBDIR under it, over the job's own "
            f"settings)"
        )
