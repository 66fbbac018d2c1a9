"""``scrapy_ha.Scheduler``: a lease-based Redis scheduler that loses nothing.

A request leaves Redis only once Scrapy is done with it: the download, the callback or errback,
every request it yielded (durable in Redis first), every item through the pipelines. A worker
killed at any instant leaves its leases to expire; any other worker requeues them.

This is the shell the engine calls, answering from memory; what Redis must learn goes into
an :class:`~.outbox.Outbox`, drained by the :class:`~.session.session.Session` (one task).
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import TYPE_CHECKING

from scrapy import Request, signals
from scrapy.utils.defer import deferred_from_coro

from scrapy_ha import metakeys
from scrapy_ha.codec import refused_scheme
from scrapy_ha.config.scheduler import SchedulerConfig
from scrapy_ha.config.startup import START_FAILED, checked_start, refuse_start, start_refused
from scrapy_ha.config.startup import asyncio_missing as _no_asyncio
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.middlewares.registry import register
from scrapy_ha.scheduler import engine
from scrapy_ha.scheduler.admission import Admission
from scrapy_ha.scheduler.buffer import FairLeaseBuffer, LeaseBuffer, SlotChooser, prefetch_target
from scrapy_ha.scheduler.domains import ClosedDomains, StartTimes
from scrapy_ha.scheduler.engine.slots import SlotLoad
from scrapy_ha.scheduler.fresh import FreshQueue, Handout
from scrapy_ha.scheduler.idle import IdleClose
from scrapy_ha.scheduler.inflight import InFlight
from scrapy_ha.scheduler.outbox import EndOp, Outbox
from scrapy_ha.scheduler.precedence import Precedence
from scrapy_ha.scheduler.session.session import Session
from scrapy_ha.scheduler.solo import Solo
from scrapy_ha.store.hosts import url_host

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Self

    from scrapy import Spider
    from scrapy.crawler import Crawler
    from twisted.internet.defer import Deferred

    from scrapy_ha.scheduler.outbox import Pair
    from scrapy_ha.store.queue import RedisQueue
    from scrapy_ha.store.wire import Lease

__all__ = ["START_FAILED", "Scheduler"]

logger = logging.getLogger(__name__)


class Scheduler:
    """Lease-based Redis scheduler; enable with ``SCHEDULER = "scrapy_ha.Scheduler"``."""

    #: The class of the background task that talks to Redis (tests give a fake).
    session_class: Callable[[Scheduler], Session] = Session

    def __init__(self, crawler: Crawler, config: SchedulerConfig) -> None:
        self.crawler, self.config = crawler, config
        assert crawler.stats is not None
        self.stats = crawler.stats
        self.spider: Spider | None = None
        self.admission = Admission.from_config(crawler, config)
        self.outbox = Outbox()
        self._slots = SlotLoad()
        self._polite = bool(config.politeness)  # crawl-wide domain limits: read once
        fair = SlotChooser(crawler, self._slots) if config.slot_fair else None
        self._buffer = LeaseBuffer() if fair is None else FairLeaseBuffer(fair)
        #: which requests go before the buffer's head (Scrapy's priority order)
        self.precedence = Precedence(
            self._buffer,
            self.outbox,
            config,
            target=self._target,
            alone=lambda: self.solo.running,
            may_keep=self._domain_free,
            slot_free=lambda request: self._slots.free(crawler, request),
        )
        start_queue = str(crawler.settings.get("SCHEDULER_START_MEMORY_QUEUE") or "")
        self.inflight = InFlight(crawler, self.outbox, config, lambda: self.server_time_ms() / 1e3)
        #: new requests handed out from memory before Redis has them (see _fresh)
        self.handout = Handout(
            crawler,
            self.outbox,
            self.inflight,
            self._slots,
            lambda: self.session.wake(),
            queue=FreshQueue(
                lifo=config.order == "lifo",
                start_lifo="lifo" in start_queue.lower(),
                fair=fair,
                keep=self.precedence.keep,
            ),
            early=config.early_download,
            compactor=self.admission.compactor,
        )
        self.handout.gate.guard.held = self.local_leases
        self.inflight.on_retry = self.handout.gate.replaced
        schemes = self.admission.schemes
        self.inflight.may_carry = lambda r: self._domain_free(r) and not refused_scheme(r, schemes)
        self.closed = ClosedDomains(self.outbox.gates)  # closed for every worker (429)
        wake, interval = partial(engine.wake, crawler), config.politeness.interval
        self._starts = StartTimes(wake, interval, partial(self._slots.unsent, crawler))
        self.solo = Solo(self._buffer, self.inflight, self.outbox, crawler)
        self._fatal = False  # the crawl could not start (logged): exit with an error
        self.session = self.session_class(self)
        self.idle = IdleClose(
            crawler, config.idle_timeout, self.keep_alive, self._unacked, self.session
        )
        self.precedence.session = self.session
        self.solo.announcer, self.solo.wake = self.session.renewals, self.session.wake
        register(crawler, self)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        """A bad setting does not raise here (Scrapy would print follow-on tracebacks of
        components never opened): it is logged, and ``open()`` closes the spider cleanly. From
        here on every log line is masked (the add-on does it before Scrapy logs the settings)."""
        if (scrapys := checked_start(crawler, engine.started_first(crawler))) is not None:
            return scrapys  # type: ignore[return-value]
        try:
            config = SchedulerConfig.from_settings(crawler.settings)
        except ConfigError as exc:
            refuse_start(crawler, str(exc))  # (said once: a middleware may have said it)
            scheduler = cls(crawler, SchedulerConfig())
            scheduler._fatal = True
            return scheduler
        return cls(crawler, config)

    @property
    def queue(self) -> RedisQueue | None:
        """The crawl's queue in Redis once open (None before, and if it could not open)."""
        return self.session.queue

    # -- the engine's interface -------------------------------------------------------

    def open(self, spider: Spider) -> Deferred[None]:
        """Connect to Redis, waiting up to ``HA_START_TIMEOUT`` for one that does not answer
        yet; then the crawl ends as ``ha_start_failed`` (``scrapy crawl`` exits with 1),
        naming the URL."""
        return deferred_from_coro(self._open(spider))

    def close(self, reason: str) -> Deferred[None] | None:
        """Flush, ack, release what it holds, unregister it; not under another reactor."""
        unopened = self._fatal and not self.queue and _no_asyncio()  # (refused at start)
        return None if unopened else deferred_from_coro(self.session.close(reason))

    def has_pending_requests(self) -> bool:
        """True while the crawl has requests waiting: in this worker's buffer or outbox (or
        carried redirects: :mod:`.carry`), or pending or delayed in Redis at the last sync (no
        round trip: the background task fetches these counts anyway)."""
        waiting = len(self.outbox.children) > len(self.handout.unstored) or self.inflight.carried
        return bool(self._buffer or waiting or self.session.remote.waiting > 0)

    def enqueue_request(self, request: Request) -> bool:
        """Queue *request* for Redis; False if this worker already saw its fingerprint.

        Until the background task sends it, ``next_request()`` may hand it out at once (see
        :mod:`scrapy_ha.scheduler.fresh`); if Redis then finds it a duplicate, its download is
        cancelled and it comes back here, refused (``request_dropped``).

        A request that cannot be stored (``HA_UNSTORABLE = "error"``) is refused (False)
        with an ERROR naming its URL, the key and the type, and the page that yielded it
        is dead-lettered with that reason when it finishes: it is never acked as done.
        Duplicates only Redis knows of are dropped there and counted in ``ha/filtered``
        (no ``request_dropped`` signal for them). A request whose URL scheme is not in
        ``HA_ALLOWED_SCHEMES`` is refused (False), a WARNING once per scheme.
        """
        if self.handout.gate.dropped(request):
            return False  # a fresh request Redis found a duplicate of (already counted)
        kin = self.inflight.kin(request)
        if kin.retry or kin.carried:  # a retry: the original's lease moves to the delayed set
            return True  # when it finishes; a carried redirect goes out first (.carry)
        entry = self.admission.admit(request, kin, self.spider)
        if entry is None:
            return False
        assert entry.fresh is not None
        self.handout.push(entry.fresh, entry.parent)
        self.outbox.add_child(entry)
        self.session.wake()
        return True

    def next_request(self) -> Request | None:
        """The next request, from memory: leased, or new from this worker and not sent to
        Redis yet (whichever comes first in Scrapy's order); None when there is neither.

        A revisit's redirect carried under its lease (:mod:`.carry`) goes first, caps or not
        (its original counts in them, and waits for it). Else None at the in-flight caps
        (``HA_MAX_INFLIGHT`` unfinished, or more handed out still holding a lease:
        :meth:`InFlight.at_cap`), or while this worker's leases may have expired.
        """
        self.handout.looked()
        carried = self.inflight.carried  # (most calls: none waits, no clock read)
        if carried.waiting and time.monotonic() <= self.session.renewals.valid_until:
            self._slots.handed(self.crawler, target := carried.take())
            return target
        if self.inflight.at_cap(self.config, self.solo.isolating, self.session.wake):
            return None
        while True:
            usable = bool(self._buffer) and time.monotonic() <= self.session.renewals.valid_until
            head = self._buffer[0] if usable else None
            if (fresh := self.handout.first(head, self._can_hand_fresh)) is not None:
                return self.handout.hand(fresh)
            if not usable:
                break
            if self.precedence.outranked():
                self.outbox.held_back = True  # for one round trip: its lease is on the way
                self.session.wake()
                return None
            # requests of a busy download slot wait here, not in the downloader, where other
            # workers could not have them
            request = self._buffer.take_first(self._ready)
            if request is None:
                return None  # every buffered request waits for a busy slot or its start time
            entry_id, token = request.meta[metakeys.LEASE]
            if self.closed and (wait := self.closed.wait(request)) > 0:
                # before run_alone: a suspect in a closed domain is deferred, and must not
                # release the whole buffer to run alone first
                self.inflight.end(EndOp("defer", entry_id, token, request, wait))
                self.session.wake()
                continue
            if request.meta.get(metakeys.SUSPECT) and not self.solo.run_alone(request, entry_id):
                return None
            self.inflight.add(entry_id, token, request)
            self._slots.handed(self.crawler, request)
            self._starts.started(request)  # (a late start holds its domain's next)
            if len(self._buffer) <= self._target() // 2 or self.precedence.outranked():
                self.session.wake()  # refill, or lease what Redis holds that goes first
            return request
        if self._buffer:
            self.session.wake()  # leases may have expired: the background task renews them
        # an empty buffer is refilled by the background task's own rounds: waking it here
        # would make every engine call a Redis round trip (a busy loop while idle)
        return None

    def __bool__(self) -> bool:
        """Always true: ``if scheduler_for(crawler):`` must not depend on the queue's size."""
        return True

    def __len__(self) -> int:
        """Requests waiting in the crawl: this worker's buffer and outbox (and carried
        redirects), plus what Redis held pending or delayed at the last sync."""
        waiting = len(self.outbox.children) - len(self.handout.unstored) + len(self._buffer)
        return waiting + len(self.inflight.carried) + max(0, self.session.remote.waiting)

    # -- for the middlewares -----------------------------------------------------------

    def server_time_ms(self) -> int:
        """The Redis server's clock, estimated from the last round trip."""
        return int(time.time() * 1000 + self.session.remote.server_offset_ms)

    def close_gate(self, request: Request, seconds: float) -> None:
        """Close the request's domain for every worker for *seconds* (429, Retry-After)."""
        if (domain := self.closed.close(request, seconds)) is not None:
            self.outbox.close_gate(domain, seconds)
            self.session.wake()

    def save_checkpoint(
        self, page: Request, task: str, doc: bytes, ttl_ms: int, *, at_finish: bool
    ) -> None:
        """Save *task*'s checkpoint under *page*'s lease: now, or when the page is acked."""
        if self.inflight.save_checkpoint(page, task, doc, ttl_ms, at_finish=at_finish):
            self.session.wake()

    # -- for the session ---------------------------------------------------------------

    def take(self, request: Request, lease: Lease) -> None:
        """Buffer a request the session leased (held, renewed and released from here on)."""
        request.meta[metakeys.LEASE] = (lease.id, lease.token)
        if lease.wait_ms > 0:  # its domain's crawl-wide rate: it may not start before then
            self.stats.inc_value("ha/domain_limited")
        if lease.wait_ms > 0 or self._polite:  # (and paced after a late start)
            self._starts.hold(request, lease.wait_ms)
        if lease.expiries:  # a page left unfinished: its links may be in Redis already
            self.handout.gate.guard.redo(lease.id)
        if lease.expiries >= max(1, self.config.max_lease_expiries - 1):
            # its last chance before the dead-letter queue: run it alone (see .solo)
            request.meta[metakeys.SUSPECT] = lease.expiries
        # one with a start time keeps its lease order (its domain's start order): placed before
        # an earlier start, it would hold its slot's others back, and all would start at once
        self._buffer.append(request, None if lease.wait_ms > 0 else lease.place)

    def empty_on_the_way(self) -> bool:
        """``next_request()`` returned None, but this worker holds requests or they are on
        their way: buffered (held back by a cap, a busy slot or a start time), new ones the
        next round leases back, pending ones in Redis at the last sync, or one that outranks
        the buffer. Then ``scheduler_empty`` is not sent (:func:`.engine.quiet_empty`): as
        with Scrapy's scheduler, which sends it only when it holds nothing, a spider feeding
        its start requests lazily is not fed while work waits; the engine looks again when a
        request finishes, at a start time or after the next sync (``held_back``). Not while
        Redis is down, the crawl is paused or closing, or a suspect runs alone."""
        session = self.session
        if not session.redis_ok or session.remote.holding or session.stopping or self.solo.running:
            return False
        if self.outbox.held_back or self._buffer:
            return True
        if len(self.outbox.children) > len(self.handout.unstored) or session.remote.pending > 0:
            self.outbox.held_back = True
            return True
        return False

    def buffered(self) -> int:
        return len(self._buffer)

    def room_for_start_urls(self) -> bool:
        held = self.session.remote.held  # Redis's memory is high: they would grow the frontier
        return not held and len(self.outbox.children) + len(self._buffer) < self._target()

    def set_gates(self, gates: dict[str, float], *, every: bool) -> None:
        """Domains closed for every worker, as Redis said (:meth:`ClosedDomains.learn`)."""
        self.closed.learn(gates, every=every)

    def local_leases(self) -> list[Pair]:
        """Leases buffered or in flight (at close: given back to Redis), in Redis already."""
        unstored = self.handout.unstored  # (their round stores them leased, or refuses them)
        held = [pair for pair in self.inflight.pairs() if pair not in unstored]
        return [r.meta[metakeys.LEASE] for r in self._buffer] + held

    def forget_local(self) -> None:
        self._buffer.clear()
        self.handout.clear()
        self.inflight.clear()

    def drop_lost(self, lost: set[Pair]) -> None:
        """Drop the buffered requests of leases lost, by (id, token) (not one leased anew);
        never one handed out before a round stored it (renewals name it, Redis may lack it)."""
        lost = lost - self.handout.unstored
        dropped = self._buffer.drop(lost) + self.inflight.drop_waiting(lost)
        real = lost - set(self.outbox.held_pairs())  # ended (acks, ends) or given back
        if real:
            self.stats.inc_value("ha/leases_lost", len(real))
            logger.warning(
                "%d lease(s) of this worker are not its own in Redis any more: reclaimed (it "
                "stalled, or lost Redis, past HA_LEASE_TIME) or lost by Redis (a restart with "
                "no persistence, a failover to a replica lacking them); %d buffered dropped",
                len(real),
                dropped,
            )

    def want(self) -> int:
        """Requests to lease in the next sync (see :class:`.precedence.Precedence`)."""
        return self.precedence.want()

    def make_room(self) -> None:
        self.precedence.make_room()

    def keep_alive(self) -> bool:
        """True while the crawl may still have work (the idle spider stays open)."""
        box, session = self.outbox, self.session
        local = bool(self._buffer or box.children or box.acks or box.ends or self.inflight)
        local = local or session.holds_unreadable()
        remote = not session.redis_ok or session.remote.active != 0 or session.remote.holding
        return bool(session.start_urls.feed_mode or local or remote)

    async def _open(self, spider: Spider) -> None:
        self.spider = spider
        # (a bad setting of its own or of a middleware: not opened)
        if not (self._fatal or start_refused(self.crawler)) and await self.session.open(spider):
            self.crawler.signals.connect(self.idle.on_idle, signal=signals.spider_idle)
            gate = self.handout.gate
            gate.installed = engine.gate_downloads(self.crawler, gate)
            engine.quiet_empty(self.crawler, self.empty_on_the_way)
            engine.on_closing(self.crawler, self.session.closing)
            self.session.start()
            return
        self._fatal = True
        refuse_start(self.crawler)  # (said where it was found)

    def _target(self) -> int:
        return prefetch_target(self.crawler, self.config, self.session.renewals.rate)

    def _can_hand_fresh(self, request: Request) -> bool:
        """A fresh request goes out now only while Redis answers (its download waits for the
        round that stores it), the crawl is not paused by its operator, its download slot has
        room, and its domain is open; else it goes to Redis with the next round, and comes back."""
        session = self.session
        if not session.redis_ok or session.stopping or session.remote.holding or self.solo.running:
            return False
        return self._domain_free(request) and self._slots.free(self.crawler, request)

    def _domain_free(self, request: Request) -> bool:
        """Its domain is open (no 429 gate), without crawl-wide limits (else: through Redis)."""
        closed = self.closed.until and self.closed.wait(request) > 0
        limited = self._polite and self.config.politeness.limited(url_host(request.url))
        return not (closed or limited)  # (the host as the scripts read it)

    def _ready(self, request: Request) -> bool:
        """Can a buffered request go now: its domain's crawl-wide rate lets it start (else a
        timer wakes the engine at its time), and its download slot has room?"""
        return not self._starts.waits(request) and self._slots.free(self.crawler, request)

    def _unacked(self) -> bool:
        return bool(self.inflight or self.outbox.acks or self.outbox.ends)
