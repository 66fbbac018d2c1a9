"""Lease renewal and heartbeat off the reactor.

A lease says "this worker process is alive", not "its event loop is responsive": a callback
that blocks on a database or a CPU-bound parse longer than ``HA_LEASE_TIME`` must not let
other workers take its requests. :class:`LeaseKeeper` renews everything the worker holds
from its own thread, on its own synchronous Redis connection, every
``HA_LEASE_RENEW_INTERVAL``. A watchdog bounds it: when the event loop has not ticked for
``HA_RENEW_WATCHDOG`` (10 lease periods by default) the loop is taken as stuck for good and
renewal stops, so the leases expire and other workers go on. :class:`LoopWatch` ticks on the
event loop every second, tells the keeper it is alive, and logs a WARNING with the length of
every stall.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import redis

from scrapy_ha.store.connection import REDIS_DOWN_ERRORS
from scrapy_ha.store.renew_wire import live_workers, lost_pairs, renew_args, worker_stats
from scrapy_ha.store.scripts import RENEW_LUA
from scrapy_ha.store.url import DEFAULT_SOCKET_TIMEOUT

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Iterable

    from scrapy_ha.keys import Keys
    from scrapy_ha.store.shards import ShardedQueue

logger = logging.getLogger(__name__)

#: Seconds between two ticks of the event-loop watch.
TICK = 1.0
#: A tick this much later than due is a stall worth a WARNING (a slow callback, not jitter).
STALL_WARNING = 2.0
#: Seconds before a late tick within which a renewal counts as made as the process woke,
#: not while the loop stalled (both run again at once after a SIGSTOP ends).
WAKE_MARGIN = 0.5
#: Lease periods the event loop may stay stuck before renewal stops (HA_RENEW_WATCHDOG).
WATCHDOG_LEASE_PERIODS = 10
#: Seconds between two renewals asked for early (requests handed to the engine are reported
#: within this): a request that kills its worker later than that counts toward poison from
#: its first death, and a busy worker adds at most a few small calls per second, each
#: carrying only the leases handed out since the last one (the full renewal of every held
#: lease stays at HA_LEASE_RENEW_INTERVAL: Redis CPU per worker does not grow with the
#: prefetch).
REPORT_GAP = 0.25

#: (entry id, token) of every lease the worker holds.
Pairs = tuple[tuple[str, str], ...]


class LeaseKeeper:
    """Renews a worker's leases and heartbeat from its own thread.

    The event loop publishes what it holds with :meth:`hold` and proves it is alive with
    :meth:`beat`; each renewal's result (its start time and the (id, token) pairs found
    lost) is handed back to the loop with ``call_soon_threadsafe``. While a sync that leases
    is in flight (:meth:`syncing`), the worker's grant key is renewed too: the loop may be
    blocked before it reads the reply, and those leases must not expire meanwhile.
    """

    def __init__(
        self,
        client: Any,
        keys: Keys,
        *,
        worker: str,
        lease_time: float,
        renew_interval: float,
        heartbeat_ttl: float,
        watchdog: float,
        loop: asyncio.AbstractEventLoop,
        on_renewed: Callable[[float, list[tuple[str, str]], int], None],
        on_reported: Callable[[frozenset[tuple[str, str]], list[tuple[str, str]]], None]
        | None = None,
        sharded: ShardedQueue | None = None,
        on_wrong_type: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.client = client
        self.keys = keys
        #: a sharded crawl's queue: its routing of ids to shards (read-only from here)
        self.sharded = sharded
        self.worker = worker
        self.lease_ms = int(lease_time * 1000)
        self.heartbeat_ms = int(heartbeat_ttl * 1000)
        self.interval = renew_interval
        self.watchdog = watchdog
        self.loop = loop
        self.on_renewed = on_renewed
        self.on_reported = on_reported
        #: called on the loop when a key renew.lua reads holds another type (set it aside)
        self.on_wrong_type = on_wrong_type
        self._script = client.register_script(RENEW_LUA)
        self._held: Pairs = ()
        self._handed: Pairs = ()  # of those, the requests handed to the engine
        #: the handed pairs of the last renewal Redis applied (marked handed there)
        self.confirmed: frozenset[tuple[str, str]] = frozenset()
        #: when each renewal Redis applied since LoopWatch last looked (time.monotonic(),
        #: taken by it: whether any was applied while the loop stalled)
        self.applied: list[float] = []
        self._nudge = threading.Event()
        #: handed to the engine since the last call that told Redis (the next early report
        #: carries only these); appended by the event loop, taken by the thread
        self._fresh: list[tuple[str, str]] = []
        self._fresh_lock = threading.Lock()
        self._last_full = time.monotonic()  # the session renewed everything just before start
        #: pages per second, published with each renewal once measured (set by the loop)
        self.rate: float | None = None
        self._syncing = False
        self._last_beat = time.monotonic()
        self._stop = threading.Event()
        self._stuck = False
        self._redis_ok = True
        self._thread = threading.Thread(target=self._run, name="scrapy-ha-keeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def hold(self, pairs: Pairs) -> None:
        """What the worker holds now (one assignment: safe to read from the thread)."""
        self._held = pairs

    def hand(self, pairs: Pairs) -> None:
        """Which held leases name requests handed to the engine (marked so in Redis: only
        their expiry counts toward poison)."""
        self._handed = pairs

    def report(self, pair: tuple[str, str]) -> None:
        """*pair*'s request was just handed to the engine: tell Redis soon (within
        :data:`REPORT_GAP`) in an early call that carries only such new pairs."""
        with self._fresh_lock:
            self._fresh.append(pair)
        self._nudge.set()

    def nudge(self) -> None:
        """Report soon (within :data:`REPORT_GAP`) what :meth:`report` collected."""
        self._nudge.set()

    def _take_fresh(self) -> list[tuple[str, str]]:
        with self._fresh_lock:
            fresh, self._fresh = self._fresh, []
        return fresh

    def _give_back(self, fresh: list[tuple[str, str]]) -> None:
        """A call that did not reach Redis: its new pairs go with the next one."""
        if fresh:
            with self._fresh_lock:
                self._fresh[:0] = fresh

    def syncing(self, in_flight: bool) -> None:
        """A sync that leases is in flight (True), or its leases were published (False)."""
        self._syncing = in_flight

    def beat(self) -> None:
        """The event loop is alive."""
        self._last_beat = time.monotonic()

    def stop(self, timeout: float | None = None) -> None:
        """Stop renewing, wait for the thread (at most *timeout* seconds, else as long as a
        renewal may take), close its connection: a call that Redis does not answer ends
        there, and the thread with it."""
        self._stop.set()
        self._nudge.set()
        if self._thread.is_alive():
            wait = self.interval + DEFAULT_SOCKET_TIMEOUT if timeout is None else timeout
            self._thread.join(timeout=wait)
        self.client.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._nudge.wait(max(0.0, self._last_full + self.interval - time.monotonic()))
            self._nudge.clear()
            if self._stop.is_set():
                return
            try:
                if time.monotonic() - self._last_full >= self.interval:
                    self._last_full = time.monotonic()  # a failed one retries at the interval
                    self.renew_once()
                else:
                    self.report_once()
            except Exception:  # the thread must outlive any one failure
                if self._stop.is_set():  # stop() closed the connection under a stalled call
                    logger.debug("Lease renewal cut short by the close", exc_info=True)
                    return
                logger.exception("Lease renewal failed; retrying in %g s", self.interval)
            self._stop.wait(REPORT_GAP)  # early reports asked for meanwhile make one

    def _may_renew(self) -> bool:
        """False once the event loop has been stuck past the watchdog, or the keeper is
        stopping (a late renewal would re-add the heartbeat of a worker that left)."""
        if self._stop.is_set():
            return False
        stalled = time.monotonic() - self._last_beat
        if stalled > self.watchdog:
            if not self._stuck:
                self._stuck = True
                logger.error(
                    "The event loop has been stuck for %.0f s (HA_RENEW_WATCHDOG=%gs): this "
                    "worker stops renewing its leases so that other workers take them over",
                    stalled,
                    self.watchdog,
                )
            return False
        self._stuck = False
        return True

    def report_once(self) -> None:
        """An early call: marks (and renews) only the leases handed to the engine since the
        last call, so that Redis counts them toward poison; the other held leases wait for
        the full renewal."""
        if not self._may_renew():
            return
        fresh = self._take_fresh()
        if not fresh:
            return
        reply = self._renew(fresh, fresh, fresh, grant=False)
        if reply is None:
            return
        lost = lost_pairs(reply)
        if self.on_reported is not None and not self._stop.is_set():
            self.loop.call_soon_threadsafe(self.on_reported, frozenset(fresh), lost)

    def renew_once(self) -> None:
        """One renewal of every held lease (see :meth:`_may_renew`); it marks the handed
        ones, those reported early since included."""
        if not self._may_renew():
            return
        started = time.monotonic()
        fresh = self._take_fresh()
        held = self._held
        handed = (*self._handed, *fresh) if fresh else self._handed
        reply = self._renew(held, handed, fresh, grant=self._syncing)
        if reply is None:
            return
        self.applied.append(time.monotonic())
        lost = lost_pairs(reply)
        self.confirmed = frozenset(handed).difference(lost)  # (a stale one is never confirmed)
        if lost:  # a pair named as handed alone, not held, was handed out from memory and
            # not stored yet: Redis may lack it, and the loop may read the round that stores
            # it before this reply (taken for lost then); once stored, it is held
            renewed = {*held, *fresh}
            lost = [pair for pair in lost if pair in renewed]
        if not self._stop.is_set():
            self.loop.call_soon_threadsafe(self.on_renewed, started, lost, live_workers(reply))

    def _renew(
        self,
        pairs: Iterable[tuple[str, str]],
        handed: Iterable[tuple[str, str]],
        fresh: list[tuple[str, str]],
        *,
        grant: bool,
    ) -> Any:
        """One renew.lua call (*pairs* renewed, *handed* marked as given to the engine, the
        worker's grant too when *grant*); None when Redis failed it, and then the *fresh*
        pairs wait for the next call."""
        try:
            if self.sharded is not None:
                reply = self._renew_shards(self.sharded, pairs, handed, grant=grant)
            else:
                reply = self._renew_one(self.keys, pairs, handed, grant=grant)
        except (*REDIS_DOWN_ERRORS, redis.exceptions.RedisError) as exc:
            self._give_back(fresh)
            self._redis_down(exc)
            if "WRONGTYPE" in str(exc) and self.on_wrong_type and not self._stop.is_set():
                # garbage in a key it reads (workers, seen...): renewals failed for ever
                self.loop.call_soon_threadsafe(self.on_wrong_type, exc)
            return None
        self._redis_ok = True
        return reply

    def _renew_one(
        self,
        keys: Keys,
        pairs: Iterable[tuple[str, str]],
        handed: Iterable[tuple[str, str]],
        *,
        grant: bool,
    ) -> Any:
        args = renew_args(
            pairs,
            handed,
            worker=self.worker,
            lease_ms=self.lease_ms,
            heartbeat_ms=self.heartbeat_ms,
            stats=worker_stats(len(self._held), self.rate, self.interval),
        )
        names = keys.renew_keys()
        if grant:
            names.append(keys.grant(self.worker))
        return self._script(keys=names, args=args)

    def _renew_shards(
        self,
        queue: ShardedQueue,
        pairs: Iterable[tuple[str, str]],
        handed: Iterable[tuple[str, str]],
        *,
        grant: bool,
    ) -> list[Any]:
        """One renew.lua call per shard that holds some of the pairs (shard 0 always: the
        heartbeat; every shard while a sync is in flight: its grants); a reply of the same
        form, lost pairs named as the worker holds them."""
        pairs, handed = list(pairs), list(handed)
        by, handed_by = queue.split(pairs), queue.split(handed)
        every = range(len(queue.shards)) if grant else ()
        now, renewed, workers, lost = 0, 0, 0, []
        for shard in sorted({0, *by, *handed_by, *every}):
            keys = queue.shards[shard].keys
            reply = self._renew_one(keys, by.get(shard, []), handed_by.get(shard, []), grant=grant)
            now, renewed = int(reply[0]), renewed + int(reply[1])
            workers = workers or live_workers(reply)  # shard 0's: the heartbeats are there
            lost += queue.theirs(shard, lost_pairs(reply), [*pairs, *handed])
        return [now, renewed, workers, *(x for pair in lost for x in pair)]

    def _redis_down(self, exc: BaseException) -> None:
        level = logging.WARNING if self._redis_ok else logging.DEBUG
        self._redis_ok = False
        logger.log(
            level,
            "Lease renewal failed (%s: %s); retrying in %g s",
            type(exc).__name__,
            exc,
            self.interval,
        )


class LoopWatch:
    """Ticks on the event loop every :data:`TICK` seconds: beats the keeper, publishes what
    the worker holds (and which of it the engine has), and logs a WARNING with the length
    of each stall of the loop."""

    def __init__(
        self,
        keeper: LeaseKeeper,
        held: Callable[[], Pairs],
        handed: Callable[[], Pairs] = tuple,
    ) -> None:
        self.keeper = keeper
        self.held = held
        self.handed = handed
        self.loop = keeper.loop
        self._due = 0.0
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._due = time.monotonic() + TICK
        self._handle = self.loop.call_later(TICK, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()

    def _tick(self) -> None:
        now = time.monotonic()
        late = now - self._due
        applied, self.keeper.applied = self.keeper.applied, []
        if late > STALL_WARNING:
            # applied after the tick was due, and not as the process woke (SIGCONT: its
            # thread renews the moment it runs again, often before this tick; a renewal
            # counted then said leases "were renewed meanwhile" of a stopped process)
            if any(self._due <= t < now - WAKE_MARGIN for t in applied):
                meanwhile = "leases were renewed from scrapy-ha's own thread meanwhile"
            elif late <= self.keeper.interval:
                meanwhile = "scrapy-ha's own thread renews leases while it is"
            else:  # (the whole process was stopped, SIGSTOP: its thread too; or Redis away)
                meanwhile = (
                    "no lease was renewed meanwhile (the process was stopped, or Redis did "
                    "not answer): another worker redoes the pages of those that expired"
                )
            logger.warning(
                "The event loop was blocked for %.1f s (a callback or pipeline that does not "
                "yield, or the process stopped): %s",
                late,
                meanwhile,
            )
        self.keeper.beat()
        self.keeper.hold(self.held())
        self.keeper.hand(self.handed())
        self._due = now + TICK
        self._handle = self.loop.call_later(TICK, self._tick)
