"""The one background task of a scheduler that talks to Redis.

The shell (:mod:`scrapy_ha.scheduler`) answers the engine from memory; this task connects,
drains the shell's :class:`~scrapy_ha.scheduler.outbox.Outbox` in its order (children before
checkpoints before acks), leases requests in batches and hands them to the shell
(:meth:`Scheduler.take`), keeps the leases renewed (:mod:`.keeper`), reclaims expired
ones, and at close hands back to Redis everything this worker still holds."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING

import redis

from scrapy_ha.config.scheduler import default_worker_id
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.scheduler import engine
from scrapy_ha.scheduler.remote import Remote
from scrapy_ha.scheduler.session.closing import CloseClock, let_go, not_handed_back, wind_up
from scrapy_ha.scheduler.session.connect import (
    START_FAILURES,
    StartReport,
    join_run,
    joined,
    log_connected,
    open_queue,
    start_failure,
    start_wait,
)
from scrapy_ha.scheduler.session.control import (
    TASK_RESTART_WINDOW,
    TASK_RESTARTS,
    Control,
    Restarts,
)
from scrapy_ha.scheduler.session.ends import Ends
from scrapy_ha.scheduler.session.heap import FrozenHeap, TimerSweep
from scrapy_ha.scheduler.session.pressure import Pressure
from scrapy_ha.scheduler.session.refusal import Refusal
from scrapy_ha.scheduler.session.renewal import Renewals
from scrapy_ha.scheduler.session.start_urls import StartUrls
from scrapy_ha.scheduler.session.stop_at_start import StopAtStart
from scrapy_ha.scheduler.session.sync import Syncer
from scrapy_ha.store.asking import outage
from scrapy_ha.store.bloom import DupefilterRefused
from scrapy_ha.store.connection import (
    REDIS_DOWN_ERRORS,
    display_url,
    error_text,
    jittered,
    server_version,
)
from scrapy_ha.store.sharding import dupefilter_figures
from scrapy_ha.store.state import set_domain_limits
from scrapy_ha.store.wire import ChildrenLost

if TYPE_CHECKING:
    from scrapy import Spider

    from scrapy_ha.config.scheduler import SchedulerConfig
    from scrapy_ha.scheduler.session.keeper import Pairs
    from scrapy_ha.scheduler.session.shell import Shell
    from scrapy_ha.store.queue import RedisQueue

logger = logging.getLogger(__name__)


class Session:
    """Connects, syncs the outbox, leases, renews and reclaims for one scheduler's shell.

    What the shell reads here (never a round trip): ``redis_ok``, ``remote`` (what Redis
    said at the last sync), ``start_urls.feed_mode``, ``stopping``, ``renewals.valid_until``
    and ``renewals.rate``; it calls :meth:`wake` when the outbox has something new.
    """

    def __init__(self, shell: Shell) -> None:
        self.shell = shell
        self.crawler = shell.crawler
        self.stats = shell.stats
        self.outbox = shell.outbox
        self.redis_url = display_url(shell.crawler.settings)
        self.spider: Spider | None = None
        self.ends = Ends(shell.stats, shell.config.dead_letter, shell.crawler.settings)
        self.ends.compact = shell.admission.compactor.pending
        self.renewals = Renewals(
            shell.crawler.settings,
            lambda: self.config,
            self._held_pairs,
            shell.drop_lost,
            handed=shell.inflight.pairs,  # (those Redis may not have yet too: see drop_lost)
            on_bad_data=self.ends.bad_data,
        )
        shell.inflight.on_add = self.renewals.handed_out
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.heap = FrozenHeap(shell.config.gc_freeze)
        self.sweep = TimerSweep(shell.config.timer_sweep)
        self.stopping, self.redis_ok = False, False
        self.remote = Remote()  # what the shell reads of Redis (never a round trip)
        self.pressure = Pressure(shell.config.memory, shell.stats, self.remote, self.redis_url)
        self._outage = False  # Redis failed a round: renew first when it answers again
        self.restarts = Restarts()  # when the background task died (see _ended)
        self.control = Control(shell.crawler, shell.admission, shell.config.renew_interval)
        self.clock = CloseClock(shell.config.close_timeout)  # see close
        self.start_urls = StartUrls(shell.crawler, shell.admission, feed_mode=shell.config.feed)
        self.starts = StartReport(shell.crawler, shell.outbox)
        self.refusal = Refusal(shell.crawler, shell.handout, shell.outbox)  # settings refused
        self.halt = StopAtStart(shell.crawler, self.clock)  # (made in the crawl's task)
        self.syncer = Syncer(
            shell,
            ends=self.ends,
            renewals=self.renewals,
            remote=self.remote,
            starts=self.starts,
            held_pairs=self._held_pairs,
            redis_url=self.redis_url,
        )

    @property
    def queue(self) -> RedisQueue | None:
        """The crawl's queue once connected (the lease ends use the same)."""
        return self.ends.queue

    @queue.setter
    def queue(self, queue: RedisQueue | None) -> None:
        self.ends.queue = queue

    @property
    def config(self) -> SchedulerConfig:
        return self.shell.config

    def wake(self) -> None:
        """The outbox has something new (or leases may need renewing): run a round soon."""
        self._wake.set()

    def holds_unreadable(self) -> bool:
        return bool(self.ends.corrupt)

    # -- open and close --------------------------------------------------------------

    async def open(self, spider: Spider) -> bool:
        """Connect to Redis; False (the reason logged in one ERROR line) if it cannot, or
        if a stop came first (:mod:`.stop_at_start`)."""
        try:
            with self.halt.watching(self.redis_url):
                await self._connect(spider)
            return True
        except (*START_FAILURES, ValueError) as exc:  # (ValueError: ConfigError, a bad URL)
            logger.error("%s", start_failure(exc, self.redis_url))
        return False

    async def _connect(self, spider: Spider) -> None:
        if self.ends.setup_error is not None:
            raise self.ends.setup_error
        self.spider = self.ends.spider = spider
        job = getattr(spider, "_job", None)  # scrapyd passes its job id as a spider argument
        if job and not self.config.worker_id_given:
            self.shell.config = replace(self.config, worker_id=default_worker_id(job))
        cfg = self.config
        wait = start_wait(cfg, self.redis_url, self.halt)  # Redis may be starting, or failing over
        queue, info = await open_queue(self.crawler, cfg, spider, wait, sender=self.outbox.nonce)
        self.queue = self.ends.queue = queue
        self.outbox.retained.enabled = queue.numbers_children
        self.shell.admission.compactor.adopt(await self.syncer.read_dictionaries())
        # a sharded crawl's shards would each order by their own sequence
        self.shell.precedence.keep.enabled &= queue.numbers_children
        self.shell.inflight.carries = queue.numbers_children  # (a sharded crawl: no revisits)
        limits = cfg.politeness.as_hash()
        await wait.run(lambda: set_domain_limits(queue.client, queue.keys, limits))
        run = await wait.run(lambda: join_run(queue, cfg))  # before the first heartbeat
        self.shell.admission.run = run.number
        await wait.run(lambda: self.renewals.renew(queue))
        self.renewals.start_keeper(queue)
        self.redis_ok = True
        log_connected(queue, server_version(info), self.redis_url, cfg.worker_id)
        counts = await wait.run(lambda: joined(queue, cfg, spider, self.starts, run))
        self.remote.counted(counts)
        # known before the engine asks for a request: Redis's memory (the INFO of connect,
        # unless flushed since), and whether the crawl is paused (nothing handed out then)
        await self.pressure.check(self.queue, info=None if cfg.flush_on_start else info)
        if await wait.run(lambda: self.control.poll(queue, paused=True)):
            self.remote.paused = True
            logger.info("crawl paused by operator")
        self.start_urls.setup(spider, cfg)

    def start(self) -> None:
        self.heap.freeze()  # connected: what lives now lives as long as the crawl
        self.sweep.start()
        self.clock.progress()
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """The background task ended: at close, or (a bug) on an error it did not catch.
        Then nothing would sync or lease any more and the crawl would wait for ever (its
        leases renewed by the keeper): the task is started again, and if it ends so
        ``TASK_RESTARTS`` times within ``TASK_RESTART_WINDOW`` seconds, the spider is closed
        with an error (the downloads waiting for a round's verdict go on: the last flush
        stores their requests before any ack)."""
        if self.stopping or task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        self.stats.inc_value("ha/task_failed")
        deaths = self.restarts.died()
        if deaths < TASK_RESTARTS:
            logger.critical(
                "scrapy-ha's background task stopped on an error; starting it again", exc_info=exc
            )
            self.start()
            return
        logger.critical(
            "scrapy-ha's background task stopped on an error %d times within %g s: closing "
            "the spider (what this worker holds goes back to Redis)",
            deaths,
            TASK_RESTART_WINDOW,
            exc_info=exc,
        )
        self.shell.handout.gate.open_all()
        engine.close_spider(self.shell.crawler, "scrapy_ha_error")

    def closing(self) -> None:
        """The engine began closing the spider: the downloads waiting for Redis's verdict
        go on ``HA_CLOSE_TIMEOUT`` later (:mod:`.closing`; the last flush stores them)."""
        self.clock.closing(self.shell.handout.gate.open_all)

    async def close(self, reason: str) -> None:
        """Flush, ack, release what this worker holds, unregister it (:mod:`.closing`)."""
        self.stopping = True
        self.sweep.stop()
        self._wake.set()
        try:
            async with asyncio.timeout(self.clock.budget()) as bound:
                if self._task is not None:
                    await asyncio.wait([self._task])  # its last round
                if self.queue is not None:
                    await self._final_flush(reason, bound)
        except (*REDIS_DOWN_ERRORS, redis.exceptions.RedisError, ChildrenLost, ConfigError) as exc:
            held = len(self.shell.local_leases()) + len(self.outbox.acks)
            why = self.clock.silence() if bound.expired() else error_text(exc)
            not_handed_back(held, self.redis_url, why, self.config)
        finally:
            if self._task is not None:
                self._task.cancel()
            try:
                await let_go(self.renewals, self.ends, self.queue)
            finally:
                self.heap.thaw()  # last: its delay runs from the end of the flush

    async def _final_flush(self, reason: str, bound: asyncio.Timeout | None = None) -> None:
        assert self.queue is not None
        self.shell.inflight.collect_finished()
        if self.outbox.gates:
            await self.syncer.send_gates()
        while not self.refusal.error and (self.outbox.to_sync() or self.ends.corrupt):
            await self._sync(lease=0)
        held = self.shell.local_leases() + self.outbox.releases
        held += self.refusal.unfinished(self.ends)
        held += await self.syncer.never_taken(held)
        released = await self.queue.release(held)
        self.shell.forget_local()
        self.stats.inc_value("ha/released", released)
        if released:
            logger.info("Released %d lease(s) back to the queue", released)
        # before leaving (a late renewal would re-add the heartbeat of a worker that left);
        await self.renewals.stop_keeper(self.clock.left(bound))  # no longer than the close
        for name, value in (await dupefilter_figures(self.queue)).items():
            self.stats.set_value(name, value)  # the filter's error, before a finish clears it
        await self.queue.leave(self.config.worker_id, self.outbox.nonce)
        if reason == "finished":
            await wind_up(self.queue, self.shell.admission.run, self.config, bound, self.crawler)

    # -- the background loop ---------------------------------------------------------

    async def _run(self) -> None:
        delay = 0.0
        while not self.stopping:
            # cleared before the round, not after it: a wake that comes while the round
            # awaits Redis (a request taken, a child yielded) runs the next round at once
            self._wake.clear()
            try:
                more = await self._round()
                self.clock.progress()
                if not self.redis_ok:
                    logger.info("Redis at %s is reachable", self.redis_url)
                    self.ends.hold_reclaim(self.config.lease_time)
                    self.shell.admission.seen.clear()  # a failover may have lost what it sent
                self.redis_ok, delay = True, 0.0
            except DupefilterRefused as exc:  # settings no retry can fix: stop (see .refusal)
                self.stopping = self.refusal.stop(exc)
                return
            except REDIS_DOWN_ERRORS as exc:
                delay = min(self.config.reconnect_max_delay, max(0.25, delay * 2))
                wait = jittered(delay)  # workers that lost Redis together come back apart
                self._redis_down(exc, wait)
                await asyncio.sleep(wait)
                continue
            except redis.exceptions.ResponseError as exc:
                try:
                    await self.ends.bad_data(exc)
                except Exception:  # setting the garbage aside failed: the next round retries
                    logger.exception("scrapy-ha could not set bad data aside; retrying in 1 s")
                    await asyncio.sleep(1)
                continue
            except Exception:
                logger.exception("scrapy-ha background loop error; retrying in 1 s")
                await asyncio.sleep(1)
                continue
            if not more:
                await self._sleep()

    def _redis_down(self, exc: BaseException, delay: float) -> None:
        self.stats.inc_value("ha/redis_errors")
        level = logging.WARNING if self.redis_ok else logging.DEBUG
        self.redis_ok, self._outage = False, True
        self.ends.hold_reclaim(None)
        logger.log(
            level,
            "Redis at %s %s; retrying in %.2f s, nothing is lost",
            self.redis_url,
            outage(exc),
            delay,
        )

    async def _sleep(self) -> None:
        """Wait for a wake (at once if one came during the round) or the tick."""
        try:
            async with asyncio.timeout(self.config.tick):
                await self._wake.wait()
        except TimeoutError:
            pass

    async def _round(self) -> bool:
        """One round of Redis work; True if there is more to do at once."""
        assert self.queue is not None
        if self.shell.handout.has_fresh():
            # the engine's own wake-up after an enqueue is due in this turn of the loop: let
            # it take the new requests first (from memory) before this round sends them
            await asyncio.sleep(0)
        self.shell.inflight.collect_finished()
        await self.shell.admission.compactor.settle(self.syncer.dictionaries)
        now = time.monotonic()
        if self.renewals.due(now) or self._outage:
            self._outage = False  # every lease held, expired meanwhile: see Ends.hold_reclaim
            await self.renewals.renew(self.queue)
        await self.ends.reclaim_if_due(self.config, now)
        await self.pressure.check(self.queue, now)
        await self.control.poll(self.queue, now=now)
        if self.start_urls.key is not None and self.shell.room_for_start_urls():
            await self.start_urls.feed(self.queue, self.config.start_urls_batch)
        if self.outbox.gates:
            await self.syncer.send_gates()
        self.shell.make_room()
        if self.outbox.releases:
            # swapped out first: a lease added during the await is released next round
            to_release, self.outbox.releases = self.outbox.releases, []
            try:
                released = await self.queue.release(to_release)
            except BaseException:
                self.outbox.releases[:0] = to_release  # renewed meanwhile, released later
                raise
            self.stats.inc_value("ha/released", released)
        want = 0 if self.remote.held else self.shell.want()
        if not (self.outbox.to_sync() or want or self.shell.precedence.blocked.new_skip()):
            return False
        await self._sync(lease=want, more=True)
        return self.outbox.to_sync() or self.shell.precedence.blocked.take_again()

    async def _sync(self, *, lease: int, more: bool = False) -> None:
        """One sync (see :meth:`Syncer.sync`), then the engine told what changed."""
        new_work = await self.syncer.sync(lease=lease, more=more)
        await self._after_sync(new_work=new_work)

    async def _after_sync(self, *, new_work: bool) -> None:
        """Let the engine look when there is new work or when the crawl's state changed
        (edge-triggered: waking it on every round while idle would be a busy loop)."""
        self.outbox.recompute_top()
        new_work, self.outbox.held_back = new_work or self.outbox.held_back, False
        view = (self.shell.has_pending_requests(), self.shell.keep_alive())
        changed, self.remote.engine_view = view != self.remote.engine_view, view
        if changed and not view[1]:
            await self._count_peers()
        if new_work or changed:
            engine.wake(self.crawler)

    async def _count_peers(self) -> None:
        """The crawl looks finished: are other workers alive (maybe still starting)?"""
        assert self.queue is not None
        self.remote.peers = max(0, (await self.queue.counts()).workers - 1)

    def _held_pairs(self) -> Pairs:
        """Every lease this worker holds: the shell's (buffered, in flight, finished and
        not sent yet, to release) and the unreadable ones waiting to be dead-lettered.
        ``Retained.prune`` relies on it: a lease not here when the prune looks (after a
        sync's reply) has ended, and no lease is held again once it ended."""
        corrupt = [(lease.id, lease.token) for lease, *_ in self.ends.corrupt]
        return tuple(self.shell.local_leases() + self.outbox.held_pairs() + corrupt)
