"""Scrapy's depth-first order (LIFO) on a worker that leases ahead: its new requests stay with it.

In a LIFO crawl (Scrapy's default), the newest request of the highest priority goes first.
A worker's lease buffer holds requests leased ahead, older than those its callbacks yield
meanwhile; sent to Redis pending, the new ones would come back only after the buffer drained,
so within a priority the order would differ from Scrapy's by up to the prefetch target.

So a worker that is the only live one keeps its new requests. One the engine had no room
for (one it can take goes out from memory at once: :mod:`.fresh`) is stored by the
round that sends it leased to this worker, under a lease the worker made (as for one handed
out, but not marked handed: a lease that expires in the buffer is not counted towards
poison), and it joins the buffer ahead of everything buffered of its priority; a new request
not sent yet goes before the buffered ones of its priority too. The buffer keeps its bound
(the prefetch target: what a worker that dies makes others wait a lease period for stays
what it leases ahead): when the new requests do not fit, the last in line, of the
buffer and of the new ones together, do not stay: buffered ones are given back to Redis at
their place, new ones go pending. Redis then holds only requests that come after everything
buffered, and the buffer hands out in Scrapy's order, at no extra round trip (the lease rides
the round that stores the request, a give-back the next round's release), and a kept request
is never decoded (the worker keeps the request object). With DownloaderAwarePriorityQueue
a new request only crowds out buffered ones of its own download slot: the buffer hands out
by slot first, and an idle slot keeps what it can run.

Only while this worker is alone (the live workers its renewals count): with others, a worker
that preferred its own new requests would keep its buffered leases for as long as its part of
the crawl goes deeper, where the others cannot have them; so then they go first at equal
priority, and new requests go pending (within a priority the order then differs by up to the
prefetch target). Only in LIFO (in FIFO a new request comes after those pending of its
priority, which the buffer's order already gives), never for a start request (its own queue)
or a request of a domain with crawl-wide limits (Redis leases it within them) or behind a
closed 429 gate (Redis's frontier holds its queue until the gate opens), not in a
sharded crawl (each shard orders by its own sequence), nor while the crawl is paused or
stopping or a suspect runs alone (nothing is leased then).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from scrapy_ha import metakeys
from scrapy_ha.store.wire import Fresh, clamp_priority

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request

    from scrapy_ha.scheduler.buffer import Entry, LeaseBuffer
    from scrapy_ha.scheduler.outbox import Outbox, Pair
    from scrapy_ha.store.wire import NewEntry

#: The place within its priority of the first kept request (see Lease.place); the next ones
#: count down from it: before every place Redis gives (the part of a pending score is never
#: negative) and every request put back at the front of the buffer, the newest first.
KEPT_PLACE = -(2**62)

#: A place in line: (minus the priority, the place within it, a tie-break).
Line = tuple[int, int, int]


class Keep:
    """Which new requests a LIFO worker alone keeps in its buffer (see the module docstring)."""

    def __init__(
        self,
        buffer: LeaseBuffer,
        outbox: Outbox,
        *,
        enabled: bool,
        active: Callable[[], bool],
        room: Callable[[], int],
        may_keep: Callable[[Request], bool],
    ) -> None:
        self.buffer = buffer
        self.outbox = outbox
        #: a LIFO crawl; the session turns it off for a sharded crawl
        self.enabled = enabled
        self._active = active  # alone, and leasing (not paused, stopping, running a suspect)
        self._room = room  # leases the buffer may take now for new requests
        self._may_keep = may_keep  # its domain: no crawl-wide limits, no closed 429 gate
        self._places = itertools.count(KEPT_PLACE, -1)
        #: kept requests sent, not stored yet: their places in the buffer
        self._flying: dict[Fresh, tuple[int, int]] = {}
        self._flying_top: int | None = None  # the highest priority among them

    def active(self) -> bool:
        """New requests are kept now, and go before the buffered ones of their priority."""
        return self.enabled and self._active()

    @property
    def flying(self) -> int:
        """Kept requests on their way to Redis: they join the buffer with the reply."""
        return len(self._flying)

    def ahead(self) -> bool:
        """A kept request on its way to Redis goes before the buffer's head: the engine
        waits for it (one round trip) rather than take an older request of its priority."""
        top = self._flying_top
        if top is None or not self.buffer:
            return False
        head = self.buffer[0]
        return clamp_priority(head.priority) <= top and not head.meta.get(metakeys.SUSPECT)

    def choose(self, batch: list[NewEntry], make_lease: Callable[[], Pair]) -> int:
        """Mark the new requests of *batch* (about to be sent) that this worker keeps, and
        give back the buffered ones they crowd out; return how many it keeps."""
        if not self.active():
            return 0
        new = [e.fresh for e in batch if e.fresh is not None and self._eligible(e)]
        if not new:
            return 0
        # later in the batch is newer: first in line within its priority
        line: list[tuple[Line, Fresh]] = [
            ((-clamp_priority(f.request.priority), next(self._places), 0), f) for f in new
        ]
        room = max(0, self._room())
        kept = line if len(new) <= room else self._fit(line, room)
        for place, fresh in kept:
            fresh.kept = True
            fresh.lease = make_lease()
            self._flying[fresh] = place[:2]
            if self._flying_top is None or -place[0] > self._flying_top:
                self._flying_top = -place[0]
        return len(kept)

    def _fit(self, new: list[tuple[Line, Fresh]], room: int) -> list[tuple[Line, Fresh]]:
        """The *new* requests that stay, first in line first: into the *room* left, then each
        in the place of the last buffered request of its download slot, if that one comes
        after it (given back to Redis); the others go pending."""
        slot_of = self.buffer.slot_of
        last: dict[str, list[Entry]] = {}  # per slot, what may be given back, last first
        for entry in self.buffer.movable():
            last.setdefault(slot_of(entry[-1]), []).append(entry)
        for entries in last.values():
            entries.sort(key=lambda e: e[:3], reverse=True)
        kept, gone = [], []
        for place, fresh in sorted(new, key=lambda x: x[0]):
            if room > 0:
                room -= 1
            else:
                theirs = last.get(slot_of(fresh.request))
                if not theirs or theirs[0][:3] < place:
                    continue  # what its slot buffers goes first: it goes pending
                gone.append(theirs.pop(0))
            kept.append((place, fresh))
        for request in self.buffer.remove(gone):
            self.outbox.releases.append(request.meta[metakeys.LEASE])
        return kept

    def landed(self, fresh: Fresh, *, stored: bool) -> None:
        """The round sent *fresh*, kept: stored leased to this worker, it joins the buffer;
        else (a duplicate, or its page's lease was lost) it is forgotten."""
        place = self._flying.pop(fresh, None)
        if not self._flying:
            self._flying_top = None
        if place is None or not stored:
            return
        request = fresh.request
        request.meta[metakeys.LEASE] = fresh.lease
        # its own page now, as a leased request is: see Handout.hand
        request.meta.pop(metakeys.PARENT, None)
        self.buffer.append(request, place)

    def _eligible(self, entry: NewEntry) -> bool:
        fresh = entry.fresh
        return (
            fresh is not None
            and fresh.lease is None
            and not fresh.sealed
            and not entry.start
            and not fresh.request.meta.get("is_start_request")
            and self._may_keep(fresh.request)
        )
