"""Scrapy's priority order across what a worker holds and what Redis holds.

A worker hands out from its lease buffer (requests leased ahead, in Redis's order), from
its own new requests not sent yet (:mod:`scrapy_ha.scheduler.fresh`), and Redis holds the rest. A
request of a higher priority than the buffer's head, on its way to Redis or pending there
at the last sync, goes first, as from Scrapy's own priority queue: it is leased at once,
over the prefetch target (up to twice the target: the per-slot and rate limits of the
target still bound what one worker holds), and the engine waits one round trip for it. A
full buffer gives its last lease of a lower priority back for it, one per round (the lease
goes back to pending at its place). Never for ever: not while the crawl is paused, a
suspect runs alone or heads the buffer, or a lease call failed to bring such a request
(its domain at its limit parks it at every call) within the last ``FUTILE_SECONDS``
(:func:`scrapy_ha.scheduler.remote.leasable_head`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from scrapy_ha import metakeys
from scrapy_ha.scheduler.blocked import Blocked
from scrapy_ha.scheduler.keep import Keep

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request

    from scrapy_ha.config.scheduler import SchedulerConfig
    from scrapy_ha.scheduler.buffer import LeaseBuffer
    from scrapy_ha.scheduler.outbox import Outbox
    from scrapy_ha.scheduler.remote import Remote


class Peers(Protocol):
    @property
    def workers(self) -> int:
        """Live workers of the crawl at the last renewal."""


class RedisView(Protocol):
    """What the session last learnt from Redis, as precedence reads it."""

    @property
    def stopping(self) -> bool: ...
    @property
    def redis_ok(self) -> bool: ...
    @property
    def remote(self) -> Remote:
        """The counts, head and pause of the last sync."""

    @property
    def renewals(self) -> Peers: ...


class Precedence:
    """Which requests go before the buffer's head, what to lease for them, and what the
    buffer gives back (see the module docstring)."""

    def __init__(
        self,
        buffer: LeaseBuffer,
        outbox: Outbox,
        config: SchedulerConfig,
        *,
        target: Callable[[], int],
        alone: Callable[[], bool],
        may_keep: Callable[[Request], bool],
        slot_free: Callable[[Request], bool],
    ) -> None:
        self.buffer = buffer
        self.outbox = outbox
        self.config = config
        self._target = target  # the prefetch target now (it follows the measured rate)
        self._alone = alone  # a suspect runs alone: nothing is leased meanwhile
        self.session: RedisView | None = None  # the scheduler's session, once made
        #: the hosts whose full download slots hold their buffered requests (see :mod:`.blocked`)
        self.blocked = Blocked(buffer, slot_free)
        #: the new requests a LIFO worker keeps in its buffer (see :mod:`.keep`)
        self.keep = Keep(
            buffer,
            outbox,
            enabled=config.order == "lifo",
            active=self._keeps,
            room=self._room_to_keep,
            may_keep=may_keep,
        )

    def _keeps(self) -> bool:
        """This worker is the only live one, and leases (see :mod:`.keep`)."""
        session = self.session
        assert session is not None
        if session.remote.holding or session.stopping or self._alone():
            return False
        return session.renewals.workers <= 1

    def _room_to_keep(self) -> int:
        """The buffer's room for kept requests: up to the prefetch target (what a worker
        that dies can make others wait a lease period for stays what it leases ahead), less
        what a request Redis holds at a higher priority than the buffer's head needs (it is
        leased by the next round)."""
        held = len(self.buffer) + self.keep.flying
        return min(self.room_ahead(), self._target() - held) - self.behind()

    def want(self) -> int:
        """Requests to lease in the next sync: up to the prefetch target (not before the
        buffer is half empty), and the requests of a higher priority than one buffered (new
        ones, or one Redis held pending at the last sync): Redis hands them out first, and
        the buffer keeps Scrapy's order (a request buffered before them does not overtake
        them)."""
        assert self.session is not None
        if self.session.stopping or self._alone():
            return 0
        target, buffer = self._target(), self.buffer
        held = len(buffer) + self.keep.flying  # kept requests on their way join the buffer
        # a skipped host's requests wait for its slot: others are leased, within the target
        ready = held - self.blocked.held
        refill = max(0, target - held) if ready <= target // 2 else 0
        if self.blocked.futile():
            refill = 0  # Redis holds only what this worker skips
        room = self.room_ahead()
        if room <= 0:
            return refill
        if self.behind():
            # one: Redis hands out its first, which the engine waits for; more would fill
            # the buffer with what comes after it, of any priority
            return max(refill, 1)
        if not buffer or not self.outbox.children:
            return refill
        unsent = [e for e in self.outbox.children if e.taken is None]
        return max(refill, buffer.urgent(unsent, room))

    def room_ahead(self) -> int:
        """Leases the buffer may take over its target for requests of a higher priority than
        its own, or kept (see :mod:`.keep`): up to twice the target in all, within
        ``HA_PREFETCH``."""
        held = len(self.buffer) + self.keep.flying
        return min(self.config.prefetch, 2 * self._target() - held)

    def behind(self) -> bool:
        """Redis held pending, at the last sync, a request of a higher priority than the
        buffer's head, and the next round will lease it (the buffer has room, or makes room:
        :meth:`make_room`)."""
        session = self.session
        assert session is not None
        head = session.remote.head
        if session.remote.holding or self._alone() or not self.buffer.behind(head):
            return False
        if self.buffer[0].meta.get(metakeys.SUSPECT):
            return False  # first in line whatever its priority
        room = self.room_ahead()
        # a buffer over twice its target (the target shrank) drains first, without waiting
        return room > 0 or (room == 0 and self.buffer.can_give_back(head))

    def outranked(self) -> bool:
        """A request on its way to Redis, or one Redis held pending at the last sync, is of
        a higher priority than everything buffered, or a kept one on its way goes first:
        the engine waits one round trip for it."""
        assert self.session is not None
        queued = self.buffer.outranked_by(self.outbox.top) or self.keep.ahead() or self.behind()
        return queued and self.session.redis_ok

    def make_room(self) -> None:
        """Before a round: the hosts its lease passes over, and what of theirs goes back
        (:mod:`.blocked`); if :meth:`behind` and the buffer is full, give its last request of
        a lower priority back, so that the round leases the other one. One per round."""
        assert self.session is not None
        half, head = self._target() // 2, self.session.remote.head
        self.blocked.look(half)
        gone = self.blocked.give_back(half)
        if self.room_ahead() == 0 and self.behind() and (last := self.buffer.give_back(head)):
            gone.append(last)
        self.outbox.releases += (request.meta[metakeys.LEASE] for request in gone)
