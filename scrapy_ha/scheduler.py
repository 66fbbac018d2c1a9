"""``scrapy_ha.Scheduler``: a lease-based Redis scheduler that loses nothing.

A request leaves Redis only when Scrapy has completely finished with it: the
download, the callback or errback, every request it yielded (durable in Redis
first) and every item through the pipelines. A worker killed at any instant
leaves its leases to expire; any other worker puts them back in the queue.

The engine's calls (``enqueue_request``, ``next_request``) answer from memory;
one background task talks to Redis in batches.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import itertools
import logging
import time
import weakref
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import redis
import scrapy
from scrapy import Request, signals
from scrapy.crawler import Crawler
from scrapy.exceptions import CloseSpider, DontCloseSpider
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.request import referer_str
from twisted.python.failure import Failure

from scrapy_ha import __version__, metakeys
from scrapy_ha.codec import CodecError, decode_request, encode_request
from scrapy_ha.config import ConfigError, SchedulerConfig, check_start_key, default_worker_id
from scrapy_ha.connection import (
    REDIS_DOWN_ERRORS,
    RedisUnavailable,
    check_reachable,
    display_url,
    redis_from_settings,
)
from scrapy_ha.keeper import LeaseKeeper, LoopWatch, Pairs, sync_redis_from_settings
from scrapy_ha.keys import Keys
from scrapy_ha.queue import MAX_PRIORITY, Lease, NewEntry, RedisQueue, SyncResult, clamp_priority
from scrapy_ha.spiders import RedisSpiderMixin

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from typing import Self

    from scrapy import Spider
    from scrapy.crawler import Crawler
    from twisted.internet.defer import Deferred

logger = logging.getLogger(__name__)

#: Bytes of the request fingerprint kept in the dupefilter: 12 bytes (96 bits) fit Redis's
#: 16-byte allocation where 20 take 32, and two of a billion URLs collide with odds ~1e-11.
FINGERPRINT_BYTES = 12
#: Fingerprints remembered locally to drop obvious duplicates without a round trip.
LOCAL_SEEN_LIMIT = 100_000
#: Seconds given to the last flush and release at close before giving up (leases then expire).
CLOSE_TIMEOUT = 10.0
#: Requests per enqueue batch (one script call); children are always sent before acks.
BATCH = 500
#: Leased requests per request the downloader can run at once: one running, one ready, so
#: that a small crawl with CONCURRENT_REQUESTS_PER_DOMAIN=1 spreads over the workers.
PER_SLOT_PREFETCH = 2
#: Warn when the dead-letter queue passes this many entries (HA_DLQ_WARN_THRESHOLD).
DEFAULT_DLQ_WARN_THRESHOLD = 1000

#: Finish reason of a crawl that could not start (unreachable Redis, a bad setting).
START_FAILED = "ha_start_failed"
#: Scrapy 2.19 closes the spider when a spider_opened handler raises CloseSpider (checked on
#: 2.19.0; 2.16 logs the exception and goes on).
_CLOSE_SPIDER_FROM_SPIDER_OPENED = tuple(map(int, scrapy.__version__.split(".")[:2])) >= (2, 19)


def _parent_of(request: Request) -> tuple[str, str] | None:
    """The lease that fences *request*: its page's (a child), or its original's (a
    redirect, which carries the original's lease and is no retry); None for a root."""
    parent = request.meta.get(metakeys.PARENT)
    if parent is None:
        outcome = request.meta.get(metakeys.OUTCOME) or {}
        if outcome.get("op") != "retry":
            parent = request.meta.get(metakeys.LEASE)
    return (str(parent[0]), str(parent[1])) if parent else None


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _kept(exc: Exception) -> bool:
    """After these an operation is kept and retried (Redis away, or a key of the wrong type
    that the loop sets aside first); any other error costs the entry alone."""
    return isinstance(exc, REDIS_DOWN_ERRORS) or "WRONGTYPE" in str(exc)


_SCHEDULERS: weakref.WeakKeyDictionary[Crawler, Scheduler] = weakref.WeakKeyDictionary()


def scheduler_for(crawler: Crawler) -> Scheduler | None:
    """The scrapy-ha scheduler of a running crawl, or None if it uses another scheduler."""
    return _SCHEDULERS.get(crawler)


class _Buffer:
    """Leased requests waiting for the engine, highest priority first, then in lease order.

    A request of higher priority than the head (leased after it) is handed out before it,
    as Scrapy's own priority queue would. Deque-like: ``append``, ``appendleft`` (first in
    line whatever its priority), ``popleft``, ``[0]``, iteration in no particular order.
    """

    def __init__(self, requests: Iterable[Request] = ()) -> None:
        self._heap: list[tuple[int, int, Request]] = []
        self._seq = itertools.count()
        self._front = itertools.count(-1, -1)
        for request in requests:
            self.append(request)

    def append(self, request: Request) -> None:
        heapq.heappush(self._heap, (-request.priority, next(self._seq), request))

    def appendleft(self, request: Request) -> None:
        top = self._heap[0][0] if self._heap else 0
        heapq.heappush(self._heap, (min(top, -request.priority), next(self._front), request))

    def popleft(self) -> Request:
        return heapq.heappop(self._heap)[2]

    def take_first(self, ready: Callable[[Request], bool]) -> Request | None:
        """The first request in line for which *ready* is true (usually the head)."""
        if ready(self._heap[0][2]):
            return self.popleft()
        for entry in sorted(self._heap)[1:]:
            if ready(entry[2]):
                self._heap.remove(entry)
                heapq.heapify(self._heap)
                return entry[2]
        return None

    def __getitem__(self, index: int) -> Request:
        if index != 0:
            raise IndexError("only the head of the buffer can be read")
        return self._heap[0][2]

    def head_priority(self) -> int | None:
        return -self._heap[0][0] if self._heap else None

    def clear(self) -> None:
        self._heap.clear()

    def __iter__(self) -> Iterator[Request]:
        return (entry[2] for entry in self._heap)

    def __len__(self) -> int:
        return len(self._heap)


@dataclass(frozen=True)
class _Op:
    """A finished request whose lease ends otherwise than by an ack."""

    kind: str  # "retry", "dead" or "defer" (a closed domain: wait without an attempt)
    entry_id: str
    token: str
    request: Request
    delay: float = 0.0


class Scheduler:
    """Lease-based Redis scheduler; enable with ``SCHEDULER = "scrapy_ha.Scheduler"``."""

    def __init__(self, crawler: Crawler, config: SchedulerConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.stats = crawler.stats
        _SCHEDULERS[crawler] = self
        self.spider: Spider | None = None
        self.queue: RedisQueue | None = None
        self.redis_url = display_url(crawler.settings)
        self._buffer = _Buffer()
        self._inflight: dict[str, tuple[str, Request]] = {}
        self._outbox: list[NewEntry] = []
        self._acks: list[tuple[str, str]] = []
        self._ops: list[_Op] = []
        self._gate_ops: dict[str, float] = {}
        self._gates: dict[str, float] = {}
        self._server_offset_ms = 0.0
        self._dlq_warned = False
        self._cp_saves: list[tuple[str, str, str, bytes, int]] = []
        self._solo: str | None = None  # a suspect running alone
        self._to_release: list[tuple[str, str]] = []
        self._corrupt: list[tuple[Lease, str]] = []  # leased, unreadable: to dead-letter
        self._clamp_warned = False
        self._retry_priority: dict[str, int] = {}  # entry id -> priority of its retry copy
        self._keeper: LeaseKeeper | None = None  # renews from its own thread
        self._watch: LoopWatch | None = None
        self._seen: set[bytes] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._remote_active = -1
        self._remote_waiting = 0  # pending + delayed in Redis at the last sync
        self._peers = 0  # other live workers when the crawl last looked finished
        self._engine_view: tuple[bool, bool] | None = None
        self._outbox_top: int | None = None  # highest priority waiting in the outbox
        self._held_back = False
        self._dupes_logged = False
        self._start_seq = 0  # start requests seen by this worker, in start() order
        self._redis_ok = False
        self._idle_since: float | None = None
        self._last_renew = 0.0
        self._last_reclaim = 0.0
        self._leases_valid_until = 0.0
        self._acked_since_renew = 0
        self._rate = 0.0
        self._start_key: str | None = None
        self._feed_mode = config.feed
        self._fatal = False  # the crawl could not start (logged): exit with an error

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """A bad setting does not raise here (Scrapy would print follow-on tracebacks of
        components never opened): it is logged, and ``open()`` closes the spider cleanly."""
        try:
            config = SchedulerConfig.from_settings(crawler.settings)
        except ConfigError as exc:
            logger.error("scrapy-ha cannot start: %s", exc)
            scheduler = cls(crawler, SchedulerConfig())
            scheduler._fatal = True
            return scheduler
        return cls(crawler, config)

    # -- the engine's interface -------------------------------------------------------

    def open(self, spider: Spider) -> Deferred[None]:
        """Connect to Redis (fails within ``HA_CONNECT_TIMEOUT`` naming the URL)."""
        return deferred_from_coro(self._open(spider))

    def close(self, reason: str) -> Deferred[None]:
        """Flush, ack, release what this worker holds, and unregister it."""
        return deferred_from_coro(self._close(reason))

    def has_pending_requests(self) -> bool:
        """True while the crawl has requests waiting: in this worker's buffer or outbox, or
        pending or delayed in Redis at the last sync (no round trip: the background task
        fetches these counts anyway)."""
        return bool(self._buffer or self._outbox or self._remote_waiting > 0)

    def enqueue_request(self, request: Request) -> bool:
        """Queue *request* for Redis; False if this worker already saw its fingerprint.

        A request that cannot be stored (``HA_UNSTORABLE = "error"``) is refused (False)
        with an ERROR naming its URL, the key and the type, and the page that yielded it
        is dead-lettered with that reason when it finishes: it is never acked as done.
        Duplicates only Redis knows of are dropped there and counted in ``ha/filtered``
        (no ``request_dropped`` signal for them).
        """
        if self._is_retry_of_inflight(request):
            return True  # the original's lease moves to the delayed set when it finishes
        fingerprint = self._fingerprint(request)
        if fingerprint and fingerprint in self._seen:
            self._log_duplicate(request)
            return False
        try:
            payload = encode_request(request, self.spider, unstorable=self.config.unstorable)
        except CodecError as exc:
            self._unstorable(request, exc)
            return False
        if fingerprint:
            if len(self._seen) >= LOCAL_SEEN_LIMIT:
                self._seen.clear()
            self._seen.add(fingerprint)
        self._note_priority(request)
        self._outbox.append(NewEntry(fingerprint, request.priority, payload, _parent_of(request)))
        if self._outbox_top is None or request.priority > self._outbox_top:
            self._outbox_top = request.priority
        self._wake.set()
        return True

    def next_request(self) -> Request | None:
        """The next leased request, from memory; None when the local buffer is empty.

        Also None while ``HA_MAX_INFLIGHT`` requests are unfinished in the engine, or
        while this worker's leases may have expired (Redis unreachable for a lease period).
        """
        if len(self._inflight) >= self.config.max_inflight or self._isolating():
            self._collect_finished()
            if len(self._inflight) >= self.config.max_inflight or self._isolating():
                return None
        while self._buffer and time.monotonic() <= self._leases_valid_until:
            if self._outranked():
                self._held_back = True  # for one round trip: its lease is on the way
                return None
            request = self._buffer.take_first(self._slot_free)
            if request is None:
                return None  # every buffered request waits for a busy download slot
            entry_id, token = request.meta[metakeys.LEASE]
            if self._gates and (wait := self._gate_wait(request)) > 0:
                # before _run_alone: a suspect in a closed domain is deferred, and must not
                # release the whole buffer to run alone first
                self._ops.append(_Op("defer", entry_id, token, request, wait))
                self._wake.set()
                continue
            if request.meta.get(metakeys.SUSPECT) and not self._run_alone(request, entry_id):
                return None
            self._inflight[entry_id] = (token, request)
            if len(self._buffer) <= self._target() // 2:
                self._wake.set()
            return request
        if self._buffer:
            self._wake.set()  # leases may have expired: the background task renews them
        # an empty buffer is refilled by the background task's own rounds: waking it here
        # would make every engine call a Redis round trip (a busy loop while idle)
        return None

    def _log_duplicate(self, request: Request) -> None:
        """As Scrapy's RFPDupeFilter: the first duplicate, or each with DUPEFILTER_DEBUG."""
        self.stats.inc_value("ha/filtered")
        self.stats.inc_value("dupefilter/filtered")
        if self.config.dupefilter_debug:
            logger.debug(
                "Filtered duplicate request: %(request)s (referer: %(referer)s)",
                {"request": request, "referer": referer_str(request)},
            )
        elif not self._dupes_logged:
            self._dupes_logged = True
            logger.debug(
                "Filtered duplicate request: %(request)s - no more duplicates will be "
                "shown (see DUPEFILTER_DEBUG to show all duplicates)",
                {"request": request},
            )

    def _unstorable(self, request: Request, exc: CodecError) -> None:
        """Fail the page that yielded *request* (dead-lettered when it finishes)."""
        self.stats.inc_value("ha/unstorable")
        parent = self._parent_of(request)
        logger.error(
            "Cannot store %s in Redis (%s): %s (HA_UNSTORABLE=%r; make the value storable, or "
            'set HA_UNSTORABLE = "drop-key" to store the request without it)',
            request,
            exc,
            f"the page {parent} that yielded it will be dead-lettered"
            if parent is not None
            else "the request is dropped",
            self.config.unstorable,
        )
        if parent is not None:
            parent.meta[metakeys.OUTCOME] = {
                "op": "dead",
                "class": "unstorable",
                "reason": f"child {request.url}: {exc}",
            }
        self.crawler.signals.send_catch_log(
            signal=signals.spider_error, failure=Failure(exc), response=None, spider=self.spider
        )

    def _parent_of(self, request: Request) -> Request | None:
        """The in-flight page that yielded *request* (ParentLeaseMiddleware tags it)."""
        lease = request.meta.get(metakeys.PARENT)
        held = self._inflight.get(lease[0]) if lease else None
        if held is None or held[0] != lease[1]:
            return None
        return held[1]

    def _slot_free(self, request: Request) -> bool:
        """Can the downloader start *request* now? Requests of a busy download slot wait
        here, not in the downloader, where other workers could not have them."""
        downloader = getattr(self.crawler.engine, "downloader", None)
        if downloader is None:
            return True
        slot = downloader.slots.get(downloader.get_slot_key(request))
        if slot is None:
            return True  # a new slot: nothing of it is running yet
        # the slot's own set of requests it holds (running or waiting in it): O(1) per call
        return slot.concurrency <= 0 or len(slot.active) < slot.concurrency

    def _outranked(self) -> bool:
        """A request just queued outranks everything buffered (see ``_urgent``)."""
        head = self._buffer.head_priority()
        top = self._outbox_top
        return top is not None and head is not None and top > head and self._redis_ok

    def _isolating(self) -> bool:
        """True while a suspect runs alone, or waits for the engine to empty to do so."""
        if self._solo is not None:
            if self._solo in self._inflight:
                return True
            self._solo = None
        head = self._buffer[0] if self._buffer else None
        return bool(head is not None and head.meta.get(metakeys.SUSPECT) and self._inflight)

    def _run_alone(self, request: Request, entry_id: str) -> bool:
        """A request whose lease expired on its last-but-one chance may be what kills
        workers: run it with nothing else in flight or buffered, so that only its own lease
        can expire with it and innocent neighbours never reach the poison threshold.
        Returns False (and keeps it first in line) while other requests are in flight."""
        if self._inflight:
            self._buffer.appendleft(request)
            return False
        self._to_release += [r.meta[metakeys.LEASE] for r in self._buffer]
        self._buffer.clear()
        self._solo = entry_id
        self.stats.inc_value("ha/suspects_isolated")
        logger.info(
            "Running %s alone: its lease expired %d time(s) before",
            request,
            request.meta[metakeys.SUSPECT],
        )
        self._wake.set()
        return True

    def _gate_wait(self, request: Request) -> float:
        until = self._gates.get(urlparse_cached(request).hostname or "", 0.0)
        return until - time.monotonic()

    def __bool__(self) -> bool:
        """Always true: ``if scheduler_for(crawler):`` must not depend on the queue's size."""
        return True

    def __len__(self) -> int:
        """Requests waiting in the crawl: this worker's buffer and outbox, plus what Redis
        held pending or delayed at the last sync."""
        return len(self._buffer) + len(self._outbox) + max(0, self._remote_waiting)

    # -- for the middlewares -----------------------------------------------------------

    def server_time_ms(self) -> int:
        """The Redis server's clock, estimated from the last round trip."""
        return int(time.time() * 1000 + self._server_offset_ms)

    def close_gate(self, request: Request, seconds: float) -> None:
        """Close the request's domain for every worker for *seconds* (429, Retry-After)."""
        domain = urlparse_cached(request).hostname or ""
        until = time.monotonic() + seconds
        if until > self._gates.get(domain, 0):
            self._gates[domain] = until
            self._gate_ops[domain] = max(seconds, self._gate_ops.get(domain, 0))
            self._wake.set()

    def save_checkpoint(
        self, page: Request, task: str, doc: bytes, ttl_ms: int, *, at_finish: bool
    ) -> None:
        """Save *task*'s checkpoint under *page*'s lease: now, or when the page is acked."""
        lease = page.meta.get(metakeys.LEASE)
        if lease is None:
            return
        if at_finish:
            page.meta[metakeys.CHECKPOINT_SAVE] = (task, doc, ttl_ms)
        else:
            self._cp_saves.append((lease[0], lease[1], task, doc, ttl_ms))
            self._wake.set()

    def _is_retry_of_inflight(self, request: Request) -> bool:
        outcome = request.meta.get(metakeys.OUTCOME)
        lease = request.meta.get(metakeys.LEASE)
        if not outcome or outcome.get("op") != "retry" or not lease:
            return False
        held = self._inflight.get(lease[0])
        if held is None or held[1] is request:
            return False
        self._retry_priority[lease[0]] = request.priority  # (RETRY_PRIORITY_ADJUST applied)
        return True

    # -- open and close --------------------------------------------------------------

    async def _open(self, spider: Spider) -> None:
        self.spider = spider
        if not self._fatal:
            try:
                await self._connect(spider)
                return
            except (RedisUnavailable, *REDIS_DOWN_ERRORS, redis.exceptions.RedisError) as exc:
                logger.error("%s", exc)
            except ConfigError as exc:
                logger.error("scrapy-ha cannot start: %s", exc)
            except ValueError as exc:  # a REDIS_URL redis-py cannot parse
                logger.error("scrapy-ha cannot start: %s (check REDIS_URL)", exc)
        self._fail_start()

    def _fail_start(self) -> None:
        """Close the spider cleanly (one ERROR line, already logged) and make ``scrapy
        crawl`` exit non-zero: Scrapy marks a crawl whose crawler has no spider as failed.

        ``CloseSpider`` is raised from ``spider_opened``, not from ``open()``: raised there
        it would skip opening the scraper, whose close then fails with a traceback."""
        self._fatal = True
        self.crawler.signals.connect(self._refuse_start, signal=signals.spider_opened)
        # on Scrapy < 2.19 start requests may still be scheduled after spider_closed, and
        # components assert crawler.spider then: forget it only when the engine stopped
        old_scrapy = not _CLOSE_SPIDER_FROM_SPIDER_OPENED
        forget_at = signals.engine_stopped if old_scrapy else signals.spider_closed
        self.crawler.signals.connect(self._forget_spider, signal=forget_at)

    def _refuse_start(self) -> None:
        if _CLOSE_SPIDER_FROM_SPIDER_OPENED:
            raise CloseSpider(START_FAILED)
        # Scrapy < 2.19 does not honour CloseSpider from spider_opened: close right after it
        engine = self.crawler.engine
        assert engine is not None
        asyncio.get_running_loop().call_soon(
            lambda: deferred_from_coro(engine.close_spider_async(reason=START_FAILED))
        )

    def _forget_spider(self) -> None:
        self.crawler.spider = None  # type: ignore[assignment]

    async def _connect(self, spider: Spider) -> None:
        job = getattr(spider, "_job", None)  # scrapyd passes its job id as a spider argument
        if job and not self.crawler.settings.get("HA_WORKER_ID"):
            self.config = replace(self.config, worker_id=default_worker_id(job))
        cfg = self.config
        if isinstance(spider, RedisSpiderMixin):  # refused before connecting: nothing to undo
            start_key = spider.redis_key or cfg.start_urls_key % {"name": spider.name}
            check_start_key(
                self.crawler.settings, start_key, Keys(cfg.key_prefix, spider.name).pending
            )
        client = redis_from_settings(self.crawler.settings, connect_timeout=cfg.connect_timeout)
        try:
            server = await check_reachable(client, self.redis_url, cfg.connect_timeout)
        except BaseException:
            await client.aclose()
            raise
        self.queue = RedisQueue(client, Keys(cfg.key_prefix, spider.name), order=cfg.order)
        if cfg.flush_on_start:
            await self._flush_on_start()
        await self._renew()
        self._start_keeper()
        self._redis_ok = True
        logger.info(
            "scrapy-ha %s (Scrapy %s, redis-py %s, Redis %s) at %s, keys %s, worker %s",
            __version__,
            scrapy.__version__,
            redis.__version__,
            server,
            self.redis_url,
            self.queue.keys.pending.rsplit(":", 1)[0] + ":*",
            cfg.worker_id,
        )
        await self._note_joined()
        self._setup_start_urls(spider)
        self.crawler.signals.connect(self._on_idle, signal=signals.spider_idle)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _note_joined(self) -> None:
        """Read the crawl's counts once, so that ``len()`` and ``has_pending_requests()``
        answer for it from the start, and say so when joining a crawl already in Redis."""
        assert self.queue is not None
        counts = await self.queue.counts()
        self._remote_waiting = counts.pending + counts.delayed
        self._remote_active = counts.pending + counts.leased + counts.delayed
        if self._remote_active or counts.dead:
            logger.info(
                "Joining a crawl already in Redis: %d pending, %d leased, %d delayed, "
                "%d dead-lettered, %d other live worker(s)",
                counts.pending,
                counts.leased,
                counts.delayed,
                counts.dead,
                max(0, counts.workers - 1),
            )
        elif counts.fingerprints and self.config.dedupe:
            assert self.spider is not None
            logger.info(
                "The crawl of %s ran before and finished; its %d fingerprints are kept "
                "(SCHEDULER_PERSIST=True), so every request seen before, start requests "
                "included, is filtered and this run crawls only what is new. To crawl "
                "again from scratch: `scrapy-ha flush %s`, or SCHEDULER_FLUSH_ON_START=True",
                self.spider.name,
                counts.fingerprints,
                self.spider.name,
            )

    def _setup_start_urls(self, spider: Spider) -> None:
        if not isinstance(spider, RedisSpiderMixin):
            return
        self._start_key = spider.redis_key or self.config.start_urls_key % {"name": spider.name}
        if self.crawler.settings.get("HA_FEED") is None:
            self._feed_mode = spider.ha_feed
        logger.info(
            "Reading start URLs from Redis key %s%s",
            self._start_key,
            " (feed mode: waiting for more)" if self._feed_mode else "",
        )

    async def _flush_on_start(self) -> None:
        assert self.queue is not None
        counts = await self.queue.counts()
        if counts.workers:
            logger.warning(
                "SCHEDULER_FLUSH_ON_START ignored: %d other worker(s) of %s are alive",
                counts.workers,
                self.queue.keys.spider,
            )
            return
        await self.queue.flush()
        logger.info("Flushed the queue of %s (SCHEDULER_FLUSH_ON_START)", self.queue.keys.spider)

    async def _close(self, reason: str) -> None:
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            await asyncio.wait([self._task], timeout=CLOSE_TIMEOUT)
            self._task.cancel()
        if self.queue is None:
            return
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT):
                await self._final_flush(reason)
        except (*REDIS_DOWN_ERRORS, redis.exceptions.RedisError) as exc:
            logger.error(
                "Could not hand back %d lease(s) to Redis at %s at close (%s): they will be "
                "reclaimed by another worker after HA_LEASE_TIME=%gs",
                len(self._buffer) + len(self._inflight) + len(self._acks),
                self.redis_url,
                exc,
                self.config.lease_time,
            )
        finally:
            await self._stop_keeper()
            await self.queue.client.aclose()

    async def _final_flush(self, reason: str) -> None:
        assert self.queue is not None
        self._collect_finished()
        if self._gate_ops:
            await self._send_gates()
        while self._outbox or self._acks or self._ops or self._cp_saves or self._corrupt:
            await self._sync(lease=0)
        unfinished = [(i, t) for i, (t, _) in self._inflight.items()]
        held = [r.meta[metakeys.LEASE] for r in self._buffer] + unfinished + self._to_release
        held += await self._unread_grant(set(held))
        released = await self.queue.release(held)
        self._buffer.clear()
        self._inflight.clear()
        self.stats.inc_value("ha/released", released)
        if released:
            logger.info("Released %d lease(s) back to the queue", released)
        # before leaving: a late renewal would re-add the heartbeat of a worker that left
        await self._stop_keeper()
        await self.queue.leave(self.config.worker_id)
        if not self.config.persist and reason == "finished":
            if await self.queue.finish(self.config.worker_id):
                logger.info("Crawl finished: cleared its working keys (SCHEDULER_PERSIST=False)")

    async def _unread_grant(self, held: set[tuple[str, str]]) -> list[tuple[str, str]]:
        """Leases of a sync cancelled at close before its reply was read (the grant key
        has them): released with the rest rather than left to expire."""
        assert self.queue is not None
        if self._watch is None:
            return []  # no keeper: syncs write no grant
        grant = await self.queue.client.hgetall(self.queue.keys.grant(self.config.worker_id))
        pairs = {(_str(i), _str(t)) for i, t in grant.items()}
        return sorted(pairs - held)

    # -- the background loop ---------------------------------------------------------

    async def _run(self) -> None:
        delay = 0.0
        while not self._stopping:
            try:
                more = await self._round()
                if not self._redis_ok:
                    logger.info("Redis at %s is reachable", self.redis_url)
                self._redis_ok, delay = True, 0.0
            except REDIS_DOWN_ERRORS as exc:
                delay = min(self.config.reconnect_max_delay, max(0.25, delay * 2))
                self._redis_down(exc, delay)
                await asyncio.sleep(delay)
                continue
            except redis.exceptions.ResponseError as exc:
                await self._bad_redis_data(exc)
                continue
            except Exception:
                logger.exception("scrapy-ha background loop error; retrying in 1 s")
                await asyncio.sleep(1)
                continue
            if not more:
                await self._sleep()

    async def _bad_redis_data(self, exc: Exception) -> None:
        """A key of the crawl holds garbage: set it aside with the reason, go on."""
        assert self.queue is not None
        moved = await self.queue.set_aside_wrong_types() if "WRONGTYPE" in str(exc) else []
        if moved:
            self.stats.inc_value("ha/corrupt_keys", len(moved))
            logger.error(
                "Keys of the crawl held the wrong type of data and were renamed to "
                "<key>:corrupt:<time> (their content is kept there): %s",
                "; ".join(moved),
            )
            return
        logger.error("Redis refused a scrapy-ha command (%s); retrying in 1 s", exc)
        await asyncio.sleep(1)

    def _redis_down(self, exc: BaseException, delay: float) -> None:
        self.stats.inc_value("ha/redis_errors")
        level = logging.WARNING if self._redis_ok else logging.DEBUG
        self._redis_ok = False
        logger.log(
            level,
            "Redis at %s unreachable (%s: %s); retrying in %.2f s, nothing is lost",
            self.redis_url,
            type(exc).__name__,
            exc,
            delay,
        )

    async def _sleep(self) -> None:
        self._wake.clear()
        try:
            async with asyncio.timeout(self.config.tick):
                await self._wake.wait()
        except TimeoutError:
            pass

    async def _round(self) -> bool:
        """One round of Redis work; True if there is more to do at once."""
        assert self.queue is not None
        self._collect_finished()
        now = time.monotonic()
        if self._keeper is None and now - self._last_renew >= self.config.renew_interval:
            await self._renew()
        if now - self._last_reclaim >= self.config.reclaim_interval:
            await self._reclaim()
        if self._start_key is not None and len(self._outbox) + len(self._buffer) < self._target():
            await self._feed_start_urls()
        if self._gate_ops:
            await self._send_gates()
        if self._to_release:
            # swapped out first: a lease added during the await is released next round
            to_release, self._to_release = self._to_release, []
            released = await self.queue.release(to_release)
            self.stats.inc_value("ha/released", released)
        want = self._want()
        if not (self._outbox or self._acks or self._ops or self._cp_saves or want):
            return False
        await self._sync(lease=want)
        return bool(self._outbox or self._acks or self._ops or self._cp_saves)

    async def _feed_start_urls(self) -> None:
        assert self.queue is not None and self._start_key is not None
        client, batch = self.queue.client, self.config.start_urls_batch
        as_set = self.crawler.settings.getbool("REDIS_START_URLS_AS_SET")
        if as_set:
            raw = list(await client.srandmember(self._start_key, batch))
        else:
            raw = list(await client.lrange(self._start_key, 0, batch - 1))
        if not raw:
            return
        entries = [self._start_entry(data) for data in raw]
        added = await self.queue.feed(self._start_key, as_set=as_set, raw=raw, entries=entries)
        if added > 0:
            self.stats.inc_value("ha/start_urls", added)

    def _start_entry(self, data: bytes) -> NewEntry:
        assert isinstance(self.spider, RedisSpiderMixin)
        try:
            request = self.spider.make_request_from_data(data)
            self._note_priority(request)
            return NewEntry(
                self._fingerprint(request), request.priority, encode_request(request, self.spider)
            )
        except Exception as exc:
            self.stats.inc_value("ha/start_urls_invalid")
            logger.error(
                "Start URL entry %r in %s is invalid and was dropped: %s",
                data[:200],
                self._start_key,
                exc,
            )
            return NewEntry(b"", 0, b"")

    def _target(self) -> int:
        cap = min(self.config.prefetch, PER_SLOT_PREFETCH * self._capacity(self.config.prefetch))
        if self._rate > 0:
            cap = min(cap, max(1, int(self._rate * self.config.lease_time / 2)))
        return cap

    def _capacity(self, enough: int) -> int:
        """Requests the downloader can run at once for this worker: each download slot's
        concurrency, plus a new slot's (CONCURRENT_REQUESTS_PER_DOMAIN/IP); counting stops
        at *enough* (this runs on every hand-out, and a broad crawl has thousands of slots)."""
        downloader = getattr(self.crawler.engine, "downloader", None)
        if downloader is None:
            return enough
        total = downloader.ip_concurrency or downloader.domain_concurrency
        for slot in downloader.slots.values():
            if total >= enough:
                break
            total += slot.concurrency
        return total

    def _want(self) -> int:
        if self._stopping or self._solo is not None:
            return 0
        target = self._target()
        if len(self._buffer) > target // 2:
            return self._urgent(target)
        return target - len(self._buffer)

    def _urgent(self, cap: int) -> int:
        """New requests that outrank the buffer's head: lease them now, over the target,
        so that they are handed out before it (as from Scrapy's own priority queue)."""
        head = self._buffer.head_priority()
        if head is None:
            return 0
        return min(cap, sum(1 for entry in self._outbox if entry.priority > head))

    async def _sync(self, *, lease: int) -> None:
        """Enqueue new requests, then ack and end finished leases, then lease more.

        The acks and ops taken here were collected after their children were queued, so
        every child goes to Redis (in earlier batches if need be) before its parent's ack.
        """
        assert self.queue is not None
        n_acks, n_ops = len(self._acks), len(self._ops)
        while len(self._outbox) > BATCH or (self._outbox and self._cp_saves):
            batch = self._outbox[:BATCH]
            result = await self.queue.sync(enqueue=batch)
            del self._outbox[: len(batch)]
            self._count(result, len(batch))
            self._forget_refused(batch, result)
        if self._cp_saves:
            await self._save_checkpoints()
        enqueue = self._outbox[:]
        keeper = self._keeper if lease else None
        started = time.monotonic()
        if keeper is not None:
            keeper.syncing(True)  # renews this sync's leases even before we read the reply
        try:
            result = await self.queue.sync(
                enqueue=enqueue,
                ack=self._acks[:n_acks],
                lease=lease,
                lease_ms=int(self.config.lease_time * 1000),
                promote=BATCH,
                worker=self.config.worker_id if keeper is not None else None,
            )
            del self._outbox[: len(enqueue)]
            del self._acks[:n_acks]
            self._count(result, len(enqueue))
            self._forget_refused(enqueue, result)
            self._note_server(result)
            was_empty = not self._buffer
            for lease_ in result.leases:
                self._take(lease_)  # tracked (renewed, released) from here on
            if was_empty and result.leases:  # only new leases buffered: valid from the call
                self._leases_valid_until = max(
                    self._leases_valid_until, started + self.config.lease_time
                )
        finally:
            if keeper is not None:
                keeper.hold(self._held_pairs())
                keeper.syncing(False)
        await self._settle_corrupt()
        await self._end_ops(n_ops)
        await self._after_sync(result, new_work=was_empty and bool(self._buffer))

    def _forget_refused(self, sent: list[NewEntry], result: SyncResult) -> None:
        """Children refused by the parent fence were never stored: forget their
        fingerprints, or this worker would drop them as duplicates when it redoes the page.
        (Which children were refused is not reported: forgetting an accepted one only sends
        a later duplicate to Redis, whose dupefilter drops it.)"""
        if result.refused:
            self._seen.difference_update(e.fingerprint for e in sent if e.parent)

    async def _save_checkpoints(self) -> None:
        """After the children, before the acks: a checkpoint never runs ahead of the queue."""
        assert self.queue is not None
        while self._cp_saves:
            entry_id, token, task, doc, ttl_ms = self._cp_saves[0]
            saved = await self.queue.save_checkpoint(entry_id, token, task, doc, ttl_ms)
            self._cp_saves.pop(0)
            self.stats.inc_value("ha/checkpoint/saved" if saved else "ha/checkpoint/stale")
            if not saved:
                logger.warning(
                    "Checkpoint of task %s refused: this worker's lease on the page "
                    "expired (another worker has it)",
                    task,
                )

    def _note_server(self, result: SyncResult) -> None:
        now = time.monotonic()
        self._server_offset_ms = result.now_ms - time.time() * 1000
        self._remote_active = result.pending + result.leased + result.delayed
        self._gates = {d: now + (until - result.now_ms) / 1000 for d, until in result.gates.items()}

    async def _send_gates(self) -> None:
        assert self.queue is not None
        for domain, seconds in list(self._gate_ops.items()):
            await self.queue.close_gate(domain, int(seconds * 1000))
            del self._gate_ops[domain]
            logger.info(
                "Domain %s closed for %.1f s for every worker (rate limited)", domain, seconds
            )

    async def _end_ops(self, n_ops: int) -> None:
        """End the first *n_ops* finished leases; a failure costs that entry alone."""
        for op in self._ops[:n_ops]:
            try:
                await self._end(op)
            except Exception as exc:
                if _kept(exc):
                    raise
                await self._end_failed(op, exc)
            self._ops.remove(op)

    async def _end_failed(self, op: _Op, exc: Exception) -> None:
        """Dead-letter an entry whose retry or dead-letter failed, with the reason."""
        assert self.queue is not None
        reason = f"scrapy-ha could not {op.kind} it: {type(exc).__name__}: {exc}"
        self.stats.inc_value("ha/op_errors")
        info = {"class": "error", "reason": reason}
        try:
            size = await self.queue.dead_letter(
                op.entry_id, op.token, info, **self._dlq_retention()
            )
        except Exception as exc2:
            if _kept(exc2):
                raise
            logger.error(
                "Could not %s %s (%s) nor dead-letter it (%s): its lease is left to expire",
                op.kind,
                op.request,
                reason,
                exc2,
            )
            return
        if size:
            self.stats.inc_value("ha/dead/error")
            logger.error("Dead-lettered %s (class error): %s", op.request, reason)
            self._check_dlq_size(size)

    async def _end(self, op: _Op) -> None:
        """A lease that ends in the delayed set or the dead-letter queue (fenced)."""
        assert self.queue is not None
        if op.kind != "retry":
            self._retry_priority.pop(op.entry_id, None)
        if op.kind == "defer":
            due = await self.queue.retry_later(op.entry_id, op.token, int(op.delay * 1000), b"")
            self.stats.inc_value("ha/deferred" if due else "ha/stale_acks")
            return
        payload = encode_request(op.request, self.spider)
        outcome = op.request.meta.get(metakeys.OUTCOME) or {}
        if op.kind == "retry":
            due = await self.queue.retry_later(
                op.entry_id,
                op.token,
                int(outcome.get("delay", 0) * 1000),
                payload,
                self._retry_priority.pop(op.entry_id, op.request.priority),
            )
            self.stats.inc_value("ha/retry/delayed" if due else "ha/stale_acks")
            return
        await self._dead_letter(op, outcome, payload)

    async def _dead_letter(self, op: _Op, outcome: dict[str, Any], payload: bytes) -> None:
        assert self.queue is not None
        history = op.request.meta.get(metakeys.HISTORY) or []
        info = {**outcome, "history": history}
        info.pop("op", None)
        if history:
            info["first"] = history[0]["t"]
        size = await self.queue.dead_letter(
            op.entry_id, op.token, info, payload=payload, **self._dlq_retention()
        )
        if not size:
            self.stats.inc_value("ha/stale_acks")
            return
        cls = outcome.get("class", "unknown")
        self.stats.inc_value(f"ha/dead/{cls}")
        level = logging.INFO if outcome.get("errback") else logging.ERROR  # errback handled it
        logger.log(
            level,
            "Dead-lettered %s (class %s): %s after %d attempt(s)%s",
            op.request,
            cls,
            outcome.get("reason"),
            len(history) or 1,
            "; the spider's errback handled it" if outcome.get("errback") else "",
        )
        self._check_dlq_size(size)

    def _dlq_retention(self) -> dict[str, int]:
        settings = self.crawler.settings
        return {
            "max_entries": settings.getint("HA_DLQ_MAX_ENTRIES", 100_000),
            "max_age_ms": int(settings.getfloat("HA_DLQ_MAX_AGE", 30 * 86400) * 1000),
        }

    def _check_dlq_size(self, size: int) -> None:
        threshold = self.crawler.settings.getint(
            "HA_DLQ_WARN_THRESHOLD", DEFAULT_DLQ_WARN_THRESHOLD
        )
        if size >= threshold and not self._dlq_warned:
            self._dlq_warned = True
            logger.warning(
                "The dead-letter queue of %s holds %d entries (HA_DLQ_WARN_THRESHOLD=%d): "
                "see `scrapy-ha dlq list %s`",
                self.spider.name if self.spider else "?",
                size,
                threshold,
                self.spider.name if self.spider else "SPIDER",
            )

    def _count(self, result: SyncResult, sent: int) -> None:
        inc = self.stats.inc_value
        if sent:
            inc("ha/enqueued", result.added)
            if sent - result.added:
                inc("ha/filtered", sent - result.added)
                inc("dupefilter/filtered", sent - result.added)
        if result.acked:
            inc("ha/acked", result.acked)
            self._acked_since_renew += result.acked
        if result.stale:
            inc("ha/stale_acks", result.stale)
            logger.warning(
                "%d ack(s) refused: their leases had expired and were reclaimed", result.stale
            )
        if result.refused:
            inc("ha/children_refused", result.refused)
            logger.warning(
                "%d request(s) refused: the lease of the page that yielded them had "
                "expired and was reclaimed (another worker redoes that page)",
                result.refused,
            )
        if result.set_aside:
            inc("ha/dead/corrupt", result.set_aside)
            logger.error(
                "%d pending entr(ies) without an entry id moved to the dead-letter "
                "queue as corrupt",
                result.set_aside,
            )
        if result.leases:
            inc("ha/leased", len(result.leases))

    def _note_priority(self, request: Request) -> None:
        """Priorities beyond the score's range are clamped: count them, warn once."""
        if -MAX_PRIORITY <= request.priority <= MAX_PRIORITY:
            return
        self.stats.inc_value("ha/priority_clamped")
        if not self._clamp_warned:
            self._clamp_warned = True
            logger.warning(
                "Priority %d of %s is outside the range scrapy-ha stores (-%d to %d): it is "
                "queued as %d (further ones are counted in ha/priority_clamped)",
                request.priority,
                request,
                MAX_PRIORITY,
                MAX_PRIORITY,
                clamp_priority(request.priority),
            )

    def _take(self, lease: Lease) -> None:
        """Buffer a leased request; an unreadable one waits in ``_corrupt`` (still renewed)
        until it is dead-lettered."""
        try:
            request = decode_request(lease.payload, self.spider) if lease.payload else None
            if request is None:
                raise CodecError("the payload is missing")
        except Exception as exc:  # any failure to rebuild it is this entry's alone
            reason = str(exc) if isinstance(exc, CodecError) else f"{type(exc).__name__}: {exc}"
            self._corrupt.append((lease, reason))
            return
        request.meta[metakeys.LEASE] = (lease.id, lease.token)
        if lease.expiries >= max(1, self.config.max_lease_expiries - 1):
            # its last chance before the dead-letter queue: run it alone (see _run_alone)
            request.meta[metakeys.SUSPECT] = lease.expiries
        self._buffer.append(request)

    async def _settle_corrupt(self) -> None:
        while self._corrupt:
            lease, reason = self._corrupt[0]
            try:
                await self._dead_letter_corrupt(lease, reason)
            except Exception as exc:
                if _kept(exc):
                    raise  # still held and renewed: retried next round
                logger.error(
                    "Could not dead-letter corrupt queue entry %s (%s): %s; its lease "
                    "is left to expire",
                    lease.id,
                    reason,
                    exc,
                )
            self._corrupt.pop(0)

    async def _dead_letter_corrupt(self, lease: Lease, reason: str) -> None:
        assert self.queue is not None
        info = {
            "class": "corrupt",
            "reason": f"corrupt queue entry: {reason}",
            "payload": lease.payload[:200].decode("utf-8", "replace"),
        }
        await self.queue.dead_letter(lease.id, lease.token, info, **self._dlq_retention())
        self.stats.inc_value("ha/dead/corrupt")
        logger.error(
            "Queue entry %s is corrupt (%s): moved to the dead-letter queue", lease.id, reason
        )

    async def _after_sync(self, result: SyncResult, *, new_work: bool) -> None:
        """Let the engine look when there is new work or when the crawl's state changed
        (edge-triggered: waking it on every round while idle would be a busy loop)."""
        self._remote_waiting = result.pending + result.delayed
        self._outbox_top = max((entry.priority for entry in self._outbox), default=None)
        new_work, self._held_back = new_work or self._held_back, False
        view = (self.has_pending_requests(), self._keep_alive())
        changed, self._engine_view = view != self._engine_view, view
        if changed and not view[1]:
            await self._count_peers()
        if new_work or changed:
            self._wake_engine()

    async def _count_peers(self) -> None:
        """The crawl looks finished: are other workers alive (maybe still starting)?"""
        assert self.queue is not None
        self._peers = max(0, (await self.queue.counts()).workers - 1)

    def _wake_engine(self) -> None:
        slot = getattr(self.crawler.engine, "_slot", None)
        if slot is not None:
            slot.nextcall.schedule()

    # -- finished requests, renewals, reclaim --------------------------------------

    def _collect_finished(self) -> None:
        if not self._inflight:
            return
        busy = self._busy_check()
        done = [i for i, (_, r) in self._inflight.items() if not busy(r)]
        for entry_id in done:
            token, request = self._inflight.pop(entry_id)
            outcome = request.meta.get(metakeys.OUTCOME)
            if outcome and outcome.get("op") in ("retry", "dead"):
                self._ops.append(_Op(outcome["op"], entry_id, token, request))
                continue
            if metakeys.CHECKPOINT_SAVE in request.meta:
                self._cp_saves.append(
                    (entry_id, token, *request.meta.pop(metakeys.CHECKPOINT_SAVE))
                )
            self._acks.append((entry_id, token))

    def _busy_check(self) -> Any:
        """A test: is this request still somewhere in the engine?"""
        engine = self.crawler.engine
        assert engine is not None
        sets: list[set[Request]] = [engine.downloader.active]
        queued: set[int] = set()
        slot = engine.scraper.slot
        if slot is not None:
            sets.append(slot.active)
            queued = {id(r) for _, r, _ in slot.queue}
        engine_slot = getattr(engine, "_slot", None)
        if engine_slot is not None:
            sets.append(engine_slot.inprogress)
        return lambda r: id(r) in queued or any(r in s for s in sets)

    def _held_pairs(self) -> Pairs:
        """Every lease this worker holds: buffered, in flight, finished (acks and ops not
        sent yet), unreadable, and waiting to be released."""
        pairs = [r.meta[metakeys.LEASE] for r in self._buffer]
        pairs += [(i, t) for i, (t, _) in self._inflight.items()] + self._acks
        pairs += [(op.entry_id, op.token) for op in self._ops]
        pairs += [(lease.id, lease.token) for lease, _ in self._corrupt]
        return tuple(pairs + self._to_release)

    def _start_keeper(self) -> None:
        """Renew and heartbeat from a thread from now on (see :mod:`scrapy_ha.keeper`)."""
        assert self.queue is not None
        cfg = self.config
        client = sync_redis_from_settings(
            self.crawler.settings, connect_timeout=cfg.connect_timeout
        )
        self._keeper = LeaseKeeper(
            client,
            self.queue.keys,
            worker=cfg.worker_id,
            lease_time=cfg.lease_time,
            renew_interval=cfg.renew_interval,
            heartbeat_ttl=cfg.heartbeat_ttl,
            watchdog=cfg.renew_watchdog,
            loop=asyncio.get_running_loop(),
            on_renewed=self._on_renewed,
        )
        self._keeper.hold(self._held_pairs())
        self._keeper.start()
        self._watch = LoopWatch(self._keeper, self._held_pairs)
        self._watch.start()

    async def _stop_keeper(self) -> None:
        if self._watch is not None:
            self._watch.stop()
        if self._keeper is not None:
            keeper, self._keeper = self._keeper, None
            await asyncio.to_thread(keeper.stop)

    def _on_renewed(self, started: float, lost: list[tuple[str, str]]) -> None:
        """A renewal by the keeper's thread (run on the event loop)."""
        if self._keeper is None:
            return
        self._note_rate(started)
        self._leases_valid_until = started + self.config.lease_time
        if lost:  # leases given up since the snapshot (acked, released) are not lost
            if real := set(lost) & set(self._held_pairs()):
                self._drop_lost(real)

    async def _renew(self) -> None:
        assert self.queue is not None
        started = time.monotonic()
        _, lost = await self.queue.renew(
            list(self._held_pairs()),
            worker=self.config.worker_id,
            lease_ms=int(self.config.lease_time * 1000),
            heartbeat_ms=int(self.config.heartbeat_ttl * 1000),
        )
        self._note_rate(started)
        self._leases_valid_until = started + self.config.lease_time
        if lost:
            self._drop_lost(set(lost))

    def _note_rate(self, now: float) -> None:
        if self._last_renew:
            self._rate = self._acked_since_renew / max(0.001, now - self._last_renew)
        self._acked_since_renew = 0
        self._last_renew = now

    def _drop_lost(self, lost: set[tuple[str, str]]) -> None:
        """Drop the buffered requests of leases lost: by (id, token), since the same entry
        may be leased again by this worker under a new token, which is not lost."""
        before = len(self._buffer)
        self._buffer = _Buffer(r for r in self._buffer if tuple(r.meta[metakeys.LEASE]) not in lost)
        real = lost - set(self._acks)
        if real:
            self.stats.inc_value("ha/leases_lost", len(real))
            logger.warning(
                "%d lease(s) of this worker expired and were reclaimed (worker stalled or "
                "Redis unreachable longer than HA_LEASE_TIME); %d buffered request(s) dropped",
                len(real),
                before - len(self._buffer),
            )

    async def _reclaim(self) -> None:
        assert self.queue is not None
        self._last_reclaim = time.monotonic()
        result = await self.queue.reclaim(
            worker=self.config.worker_id,
            interval_ms=int(self.config.reclaim_interval * 1000),
            batch=self.config.reclaim_batch,
            max_expiries=self.config.max_lease_expiries,
            **self._dlq_retention(),
        )
        if result is None:
            return
        reclaimed, poison, set_aside = result
        if set_aside:
            self.stats.inc_value("ha/dead/corrupt", set_aside)
            logger.error(
                "%d leased entr(ies) had an unreadable lease record: moved to the "
                "dead-letter queue as corrupt",
                set_aside,
            )
        if reclaimed:
            self.stats.inc_value("ha/reclaimed", reclaimed)
            logger.warning("Reclaimed %d expired lease(s) back to the queue", reclaimed)
        for entry_id in poison:
            self.stats.inc_value("ha/dead/poison")
            logger.error(
                "Request %s dead-lettered as poison: its lease expired %d times",
                entry_id,
                self.config.max_lease_expiries,
            )

    # -- closing when the crawl is done ------------------------------------------------

    def _fingerprint(self, request: Request) -> bytes:
        """The dupefilter fingerprint, or b"" for a request that is never filtered.

        A ``dont_filter`` start request is filtered only against the same request at the
        same place in another worker's ``start()``: N workers seed the crawl once, and a
        start request repeated on purpose is crawled as often as it is repeated.
        """
        if self._is_start(request):
            self._start_seq += 1
            if request.dont_filter:
                fingerprint = self.crawler.request_fingerprinter.fingerprint(request)
                place = b"start %d " % self._start_seq + fingerprint
                return hashlib.sha1(place).digest()[:FINGERPRINT_BYTES]  # noqa: S324 - not a secret
        if request.dont_filter or not self.config.dedupe:
            return b""
        return self.crawler.request_fingerprinter.fingerprint(request)[:FINGERPRINT_BYTES]

    def _is_start(self, request: Request) -> bool:
        """A start request seen for the first time (a retry or redirect of one carries the
        lease of its original), when start requests are deduplicated across workers."""
        meta = request.meta
        return bool(
            self.config.dedupe_start_requests
            and meta.get("is_start_request")
            and metakeys.LEASE not in meta
        )

    def _on_idle(self) -> None:
        """Close at once when the crawl is verifiably finished: nothing local, nothing
        pending, leased or delayed in Redis at a sync made after this worker's last ack,
        and no other live worker; with live peers (they may still be yielding start
        requests) wait ``HA_IDLE_TIMEOUT`` first. No polling: a timer wakes the engine."""
        if self._keep_alive() or self._engine_view is None or self._engine_view[1]:
            self._idle_since = None
            raise DontCloseSpider
        if not self._peers:
            return
        now = time.monotonic()
        if self._idle_since is None:
            self._idle_since = now
        if now - self._idle_since < self.config.idle_timeout:
            asyncio.get_running_loop().call_later(
                self.config.idle_timeout - (now - self._idle_since) + 0.05, self._wake_engine
            )
            raise DontCloseSpider

    def _keep_alive(self) -> bool:
        local = (
            self._buffer
            or self._outbox
            or self._acks
            or self._ops
            or self._inflight
            or self._corrupt
        )
        return bool(self._feed_mode or local or not self._redis_ok or self._remote_active != 0)
