"""What the session last learnt from Redis: the crawl's counts, the place of the first
request pending there, whether the operator paused the crawl, the server's clock, the other
live workers. The shell reads it to answer the engine, never with a round trip; each sync's
reply updates it (:meth:`Remote.clock`, :meth:`Remote.synced`)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy_ha.store.wire import Counts, SyncResult

__all__ = ["FUTILE_SECONDS", "SKEW_WARN_MS", "ClockSteps", "Remote", "leasable_head", "warn_skew"]

logger = logging.getLogger(__name__)

#: Seconds a pending head that a lease call failed to bring is not waited for (see
#: :func:`leasable_head`): a domain's limit frees it within about that, and the engine is
#: held back at most once per this period for one that stays parked.
FUTILE_SECONDS = 1.0

#: How far (ms) this machine's clock may be from the Redis server's before the worker says
#: so when it joins (:func:`warn_skew`); the round trip counts in the measure.
SKEW_WARN_MS = 5_000.0

#: (minus a priority, until when, by time.monotonic()): see :func:`leasable_head`.
Futile = tuple[int, float]


@dataclass
class ClockSteps:
    """Steps of this machine's clock: its wall clock moved against its monotonic one (an
    NTP step, a VM resumed, an operator's ``date -s``), seen from one sync to the next."""

    wall: float = 0.0
    mono: float = 0.0

    def moved(self, wall: float | None = None, mono: float | None = None) -> float:
        """Seconds the wall clock moved since the last call beyond what the monotonic clock
        did (forward: positive; 0.0 at the first call)."""
        wall = time.time() if wall is None else wall
        mono = time.monotonic() if mono is None else mono
        moved = (wall - self.wall) - (mono - self.mono) if self.mono else 0.0
        self.wall, self.mono = wall, mono
        return moved


@dataclass
class Remote:
    """The crawl as Redis said at the last sync (``-1``: not known yet)."""

    #: pending + leased + delayed
    active: int = -1
    #: pending + delayed
    waiting: int = 0
    #: pending: leasable now
    pending: int = 0
    #: the place of the first pending request the engine may wait for (see leasable_head)
    head: tuple[int, int] | None = None
    #: ``scrapy-ha pause``: Redis leases nothing
    paused: bool = False
    #: Redis's memory is above HA_REDIS_MEMORY_HIGH (not yet below _LOW): nothing is leased
    held: bool = False
    #: other live workers when the crawl last looked finished
    peers: int = 0
    #: the Redis server's clock minus this machine's, in ms
    server_offset_ms: float = 0.0
    #: (has pending requests, keep alive) as the engine was last told
    engine_view: tuple[bool, bool] | None = None
    #: see :func:`leasable_head`
    futile: Futile | None = None
    #: this machine's clock set forward or back while the worker runs
    steps: ClockSteps = field(default_factory=ClockSteps)

    @property
    def holding(self) -> bool:
        """Nothing new is leased or handed out from memory: the operator paused the crawl,
        or Redis's memory is high (see :mod:`.session.pressure`)."""
        return self.paused or self.held

    def counted(self, counts: Counts) -> None:
        """The counts a worker reads when it joins the crawl (and Redis's clock, before
        its first sync: a visit may end before it)."""
        if counts.now_ms:
            self.server_offset_ms = counts.now_ms - time.time() * 1000
            warn_skew(self.server_offset_ms)
            self.steps.moved()
        self.waiting = counts.pending + counts.delayed
        self.pending = counts.pending
        self.active = counts.pending + counts.leased + counts.delayed

    def clock(self, result: SyncResult) -> None:
        """A sync's reply, as soon as it comes: the server's clock and the active count (a
        sharded round that called no shard has no clock: now_ms 0)."""
        if result.now_ms:
            self.server_offset_ms = result.now_ms - time.time() * 1000
            if abs(moved := self.steps.moved()) * 1000 >= SKEW_WARN_MS:
                warn_skew(self.server_offset_ms, moved)
        self.active = result.pending + result.leased + result.delayed

    def synced(self, result: SyncResult, *, asked: bool) -> None:
        """A sync's reply once its ends are sent (*asked*: it leased): what waits in Redis,
        the head the engine may wait for, the operator's pause."""
        self.waiting = result.pending + result.delayed
        self.pending = result.pending
        result.head, self.futile = leasable_head(
            result, waited=self.head, asked=asked, futile=self.futile
        )
        self.head = result.head
        if result.paused != self.paused:
            self.paused = result.paused
            logger.info("crawl %s by operator", "paused" if self.paused else "resumed")


def warn_skew(offset_ms: float, moved: float = 0.0) -> None:
    """One WARNING when the Redis server's clock minus this machine's, *offset_ms*, is
    ``SKEW_WARN_MS`` or more either way, or when this machine's clock was just set
    forward or back by *moved* seconds: the crawl keeps its times by Redis's clock, but
    the worker's log lines and Scrapy's (Twisted's) own timers go by this machine's."""
    if not (abs(offset_ms) >= SKEW_WARN_MS or moved):  # (nan: no warning)
        return
    logger.warning(
        "This machine's clock %sis %.1f s %s the Redis server's: leases, retries, gates, "
        "revisits and rates go by Redis's clock, so the crawl does not depend on it, but "
        "this worker's log lines do, and so do Scrapy's own timers (a clock set forward "
        "times out the downloads on their way); sync it (NTP)",
        f"was set {abs(moved):.1f} s {'forward' if moved > 0 else 'back'} and " if moved else "",
        abs(offset_ms) / 1000,
        "behind" if offset_ms > 0 else "ahead of",
    )


def leasable_head(
    result: SyncResult,
    *,
    waited: tuple[int, int] | None,
    asked: bool,
    futile: Futile | None,
    now: float | None = None,
) -> tuple[tuple[int, int] | None, Futile | None]:
    """The pending head of *result* the engine may be held back for (None: none), and the
    new *futile* state.

    *waited* is the head reported by the sync before (what the buffer may have waited for),
    *asked* whether this sync asked for leases. A lease call that brought nothing of the
    waited head's priority or higher (the crawl is paused, or the head's domain is at its
    limit and the call parked it again) makes heads of that priority and below not waited
    for, for ``FUTILE_SECONDS`` or until a lease of that priority comes: else every sync
    that only acks would report it again, and the engine would wait for it every other
    round."""
    now = time.monotonic() if now is None else now
    if asked:
        best = min((x.place[0] for x in result.leases if x.place), default=None)
        if waited is not None and (best is None or best > waited[0]):
            futile = (waited[0], now + FUTILE_SECONDS)
        elif futile is not None and best is not None and best <= futile[0]:
            futile = None
    head = result.head
    if head is not None and futile is not None and now < futile[1] and head[0] >= futile[0]:
        return None, futile
    return head, futile
