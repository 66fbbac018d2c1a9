"""Keeping a worker's leases renewed: the session's glue to :mod:`.keeper`.

Renewal runs from the keeper's thread once the session has connected (before that, and in
tests without a keeper, the session renews on the event loop). Every renewal vouches for
the leases held at its start for one ``HA_LEASE_TIME``: the shell hands out buffered
requests only while that holds. The acks counted between two renewals give the rate that
caps the prefetch (no more leased than can be done within half a lease period).

Each renewal also tells Redis which leases name requests handed to the engine (``handed``):
only the expiry of such a lease counts toward poison, so a worker that dies with a full
buffer makes none of the buffered requests suspect. A hand-out asks the keeper for an early
report (at most one per :data:`.keeper.REPORT_GAP`) that carries only the pairs
handed out since the last call: the full renewal stays at ``HA_LEASE_RENEW_INTERVAL``. A
request that kills its worker before that report reached Redis is not counted that time;
its expiries still add up (Redis counts them all apart) until the worker runs it alone as
a suspect, and a suspect is handed out only once a call has told Redis
(:meth:`Renewals.announce`): a request that kills its worker within milliseconds is
counted from then on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import redis

from scrapy_ha.scheduler.session.keeper import LeaseKeeper, LoopWatch
from scrapy_ha.store.connection import sync_redis_from_settings

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    from scrapy.settings import BaseSettings

    from scrapy_ha.config.scheduler import SchedulerConfig
    from scrapy_ha.scheduler.outbox import Pair
    from scrapy_ha.scheduler.session.keeper import Pairs
    from scrapy_ha.store.queue import RedisQueue

logger = logging.getLogger(__name__)

#: Seconds the keeper's stop waits at most for a set-aside it asked for (the close's own
#: budget is for leaving; a relink cut short is marked owed, and the finish does it).
SET_ASIDE_WAIT = 1.0


class Renewals:
    """Renews what ``held()`` names, marking what ``handed()`` names as handed to the
    engine; calls ``on_lost`` with the (id, token) pairs lost."""

    def __init__(
        self,
        settings: BaseSettings,
        config: Callable[[], SchedulerConfig],
        held: Callable[[], Pairs],
        on_lost: Callable[[set[tuple[str, str]]], None],
        handed: Callable[[], Iterable[Pair]] = tuple,
        on_bad_data: Callable[[Exception], Awaitable[None]] | None = None,
    ) -> None:
        self.settings = settings
        #: sets aside the crawl's keys that hold garbage (a renewal's WRONGTYPE)
        self.on_bad_data = on_bad_data
        self._setting_aside: asyncio.Task[None] | None = None
        self.config = config  # read at each use: the worker id is final only once connected
        self.held = held
        self.on_lost = on_lost
        self.handed = handed
        self._announced: dict[Pair, Callable[[], None]] = {}  # suspects Redis must learn of
        self._reported: set[Pair] = set()  # announced, and Redis knows: may be handed out
        self.keeper: LeaseKeeper | None = None  # renews from its own thread
        self.watch: LoopWatch | None = None
        self.valid_until = 0.0  # monotonic time until which every held lease is valid
        self.rate = 0.0  # acks per second, measured between renewals
        self.measured = False  # whether rate was measured (before: none is published)
        self.workers = 0  # live workers at the last renewal, this one included (0: none yet)
        self.acked = 0  # acks since the last renewal
        self._last_renew = 0.0

    def due(self, now: float) -> bool:
        """A renewal from the event loop is due (no keeper thread runs)."""
        if self.keeper is not None:
            return False
        return bool(self._announced) or now - self._last_renew >= self.config().renew_interval

    def announce(self, pair: Pair, then: Callable[[], None]) -> None:
        """Tell Redis at once that *pair*'s request is handed to the engine (a suspect about
        to run alone), and call *then* once it knows (see :meth:`reported`)."""
        if pair in self._announced or pair in self._reported:
            return
        self._announced[pair] = then
        if self.keeper is not None:
            self.keeper.report(pair)

    def handed_out(self, pair: Pair) -> None:
        """*pair*'s request was handed to the engine: report it early (the keeper coalesces
        the reports into one small call carrying only such pairs), so that it counts toward
        poison if it kills the worker after that."""
        if self.keeper is not None:
            self.keeper.report(pair)

    def announcing(self) -> bool:
        """An announced lease waits for a renewal to reach Redis."""
        return bool(self._announced)

    def reported(self, pair: Pair) -> bool:
        """Redis knows *pair* was handed out (announced, and a renewal went through); true
        once: the caller hands the request out now."""
        if pair in self._reported:
            self._reported.discard(pair)
            return True
        return False

    def _handed_now(self) -> Pairs:
        return (*self.handed(), *self._announced)

    def _confirm(self, confirmed: Iterable[Pair], lost: Iterable[Pair]) -> None:
        gone = set(lost)
        for pair in gone:  # a lost lease is never handed out
            self._announced.pop(pair, None)
        for pair in (set(confirmed) - gone) & set(self._announced):
            self._reported.add(pair)
            self._announced.pop(pair)()

    def start_keeper(self, queue: RedisQueue) -> None:
        """Renew and heartbeat from a thread from now on (see :mod:`.keeper`)."""
        from scrapy_ha.store.shards import ShardedQueue  # the keeper renews each shard's

        config = self.config()
        client = sync_redis_from_settings(self.settings, connect_timeout=config.connect_timeout)
        self.keeper = LeaseKeeper(
            client,
            queue.keys,
            worker=config.worker_id,
            lease_time=config.lease_time,
            renew_interval=config.renew_interval,
            heartbeat_ttl=config.heartbeat_ttl,
            watchdog=config.renew_watchdog,
            loop=asyncio.get_running_loop(),
            on_renewed=self._on_renewed,
            on_reported=self._on_reported,
            sharded=queue if isinstance(queue, ShardedQueue) else None,
            on_wrong_type=self._on_wrong_type,
        )
        self.keeper.hold(self.held())
        self.keeper.hand(self._handed_now())
        self.keeper.start()
        self.watch = LoopWatch(self.keeper, self.held, self._handed_now)
        self.watch.start()

    async def stop_keeper(self, timeout: float | None = None) -> None:
        """Stop the keeper's renewals, waiting for its thread at most *timeout* seconds
        (see :meth:`LeaseKeeper.stop`)."""
        if self.watch is not None:
            self.watch.stop()
        if self.keeper is not None:
            keeper, self.keeper = self.keeper, None
            await asyncio.to_thread(keeper.stop, timeout)
        task = self._setting_aside
        if task is not None and not task.done():  # its rename and relink are two steps: a
            # cancel between them left back queues no key names (a review); never cancelled
            await asyncio.wait([task], timeout=min(SET_ASIDE_WAIT, timeout or SET_ASIDE_WAIT))
            task.cancel()  # (past that: the relink it owes is marked, the finish does it)

    def _on_wrong_type(self, exc: BaseException) -> None:
        """A renewal met a key of another type (run on the event loop): set it aside, once
        at a time; the next renewal goes through."""
        busy = self._setting_aside is not None and not self._setting_aside.done()
        if self.on_bad_data is not None and isinstance(exc, Exception) and not busy:
            self._setting_aside = asyncio.ensure_future(self.on_bad_data(exc))
            self._setting_aside.add_done_callback(_said)

    def _on_renewed(self, started: float, lost: list[tuple[str, str]], workers: int) -> None:
        """A renewal by the keeper's thread (run on the event loop)."""
        if self.keeper is None:
            return
        self.workers = workers
        self._note_rate(started)
        self.valid_until = started + self.config().lease_time
        self._confirm(self.keeper.confirmed, lost)
        if lost:  # leases given up since the snapshot (acked, released) are not lost
            if real := set(lost) & set(self.held()):
                self.on_lost(real)

    def _on_reported(self, reported: frozenset[Pair], lost: list[Pair]) -> None:
        """An early report by the keeper's thread (run on the event loop): it renewed only
        the pairs it carried, so the validity of the others stays as it was."""
        if self.keeper is None:
            return
        self._confirm(reported, lost)
        if lost and (real := set(lost) & set(self.held())):
            self.on_lost(real)

    async def unread_grant(self, queue: RedisQueue, worker: str) -> list[Pair]:
        """The leases the grant key names (those of the worker's latest call that named it):
        a call whose reply was never read has its leases released by the next call or the
        close (:class:`~scrapy_ha.scheduler.session.sync.Syncer`) rather than left to expire."""
        if self.watch is None:
            return []  # no keeper: syncs write no grant
        try:
            grant = await queue.granted(worker)
        except redis.exceptions.ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            # not a hash (written by something else): the next call names none of this
            # worker's leases in it, and sync.lua writes it anew; nothing to give back
            logger.warning("The lease grant of worker %s is not a hash: %s", worker, exc)
            return []
        return [(_str(i), _str(t)) for i, t in grant.items()]

    async def renew(self, queue: RedisQueue) -> None:
        """Renew from the event loop (at connect, and while no keeper thread runs)."""
        config = self.config()
        started = time.monotonic()
        handed = self._handed_now()
        _, lost = await queue.renew(
            list(self.held()),
            worker=config.worker_id,
            lease_ms=int(config.lease_time * 1000),
            heartbeat_ms=int(config.heartbeat_ttl * 1000),
            handed=handed,
            rate=self.rate if self.measured else None,
        )
        self.workers = queue.live_workers
        self._note_rate(started)
        self.valid_until = started + config.lease_time
        self._confirm(handed, lost)
        if lost:
            self.on_lost(set(lost))

    def _note_rate(self, now: float) -> None:
        if now - self._last_renew < self.config().renew_interval / 2:
            return  # an early renewal: too short a window to measure the rate over
        if self._last_renew:
            self.rate = self.acked / max(0.001, now - self._last_renew)
            self.measured = True
            if self.keeper is not None:
                self.keeper.rate = self.rate
        self.acked = 0
        self._last_renew = now


def _str(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _said(task: asyncio.Task[None]) -> None:
    """Log what ended a set-aside the keeper asked for, if it failed (a task nobody
    awaits: else "Task exception was never retrieved"); the next renewal asks again."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        logger.warning("Setting aside a key the renewals could not read failed: %r", exc)
