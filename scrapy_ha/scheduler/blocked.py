"""Hosts a worker cannot download now while it holds their next requests: its lease passes
them over.

A request whose download slot is full (a slow host: its pages take seconds, as many at once
as ``CONCURRENT_REQUESTS_PER_DOMAIN`` lets it) waits in the lease buffer, not in the
downloader, where other workers could not have it. It counted as held like any other: once
a slow host's requests filled half the prefetch target, the worker leased nothing more until
they drained, and its other hosts' requests waited in Redis (docs/benchmarks.md, "Head of
line": one host whose pages take 3 s, among 50 fast ones, cut the fast hosts' pages per
second to 0.18 of their rate, one worker and no crawl-wide limits).

So before each round, the hosts whose slots are full, once the buffer holds half the
target or more of them together (three slow hosts each below half filled it before), are
*skipped*: the round's lease passes its queues over (they stay ready in
Redis, in their place, for the other workers and the rounds after: ``lua/lib/frontier.lua``).
While Redis has other hosts' requests (the reply to a round that skipped the same hosts
named a head), the skipped hosts' buffered requests past half the target, the last in line,
go back to Redis (at their place: another worker, or this one once the slot has room, leases
them), and those left do not count towards the half that stops a refill: the round leases
the other hosts' requests, the buffer within its target (what a killed worker leaves to
redo is bounded as before). A crawl of one host has no other requests: nothing goes back.
Scrapy's priority order holds: the lease passes over a skipped host's queues of the
priorities the worker holds of it and below only, so a request of a higher priority is
leased (and named the head) as before; and a lone LIFO worker still keeps the host's new
requests (:mod:`.keep`: the newest first), the older ones going back. A round that leases
while such hosts are skipped wakes the engine (it looked at the buffer last as a download
ended: ``session/sync.py``). A host skipped while others wait stays skipped while its slot
is full and the buffer holds any of it (else each of its downloads would lease back what
went back). Not in a sharded crawl: its leases carry no place in Redis's order, and none is
given back (:meth:`LeaseBuffer.movable`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy_ha.store.hosts import url_host

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request

    from scrapy_ha.scheduler.buffer import Entry, LeaseBuffer

__all__ = ["Blocked"]


class Blocked:
    """The hosts the next round's lease passes over (see the module docstring)."""

    def __init__(self, buffer: LeaseBuffer, slot_free: Callable[[Request], bool]) -> None:
        self.buffer = buffer
        self._slot_free = slot_free  # the request's download slot has room now
        #: the hosts skipped -> the highest priority buffered of each: the lease passes over
        #: their queues up to it
        self.skip: dict[str, int] = {}
        #: what the last sync skipped (its reply's head is none of theirs)
        self.sent: dict[str, int] = {}
        #: that sync's reply named a head, as Redis sent it (the session may hold back
        #: from waiting for a head it reports: ``remote.leasable_head``)
        self.named = False
        #: the buffered requests of the hosts skipped by that sync too (see give_back)
        self.held = 0
        self._entries: list[Entry] = []
        self._again = False  # see take_again
        self._looks = 0  # rounds looked at (look), and the one take_again last said yes in
        self._again_at = -2

    @property
    def others(self) -> bool:
        """Redis has other hosts' requests: the reply to the last sync that skipped some
        named a head."""
        return self.named and bool(self.sent)

    def synced(self, skip: dict[str, int], head: tuple[int, int] | None) -> None:
        """A sync that skipped *skip* has replied, naming *head* (None: none)."""
        # not in the round right after one it ran at once: a host whose slot is full at one
        # round and has room at the next (a download ended) is new to every other sync, and
        # the loop would run its rounds back to back, a sync each, while downloads end
        again = self._looks > self._again_at + 1
        self._again = again and head is not None and self.new_skip(skip)
        self.sent, self.named = skip, head is not None

    def new_skip(self, skip: dict[str, int] | None = None) -> bool:
        """*skip* (the hosts skipped now) names one the last sync did not skip: only a sync
        that skips it tells whether Redis has other hosts' requests (its reply names a
        head), so the round syncs even with nothing else to send."""
        return any(host not in self.sent for host in (self.skip if skip is None else skip))

    def take_again(self) -> bool:
        """The last sync skipped a host for the first time and Redis has other hosts'
        requests: the next round, at once, gives back what the host holds past half the
        target and leases the others' (:meth:`give_back`). Before, it waited for the
        background loop's tick or a wake, while the engine had only the busy host's
        requests to take (a QA run: one host of 3 s a page among fast ones, no other
        request downloaded for 0.25 to 0.75 s after each wave of its downloads ended). Not
        twice in a row: hosts whose slots flip between rounds would spin the loop."""
        again, self._again = self._again, False
        if again:
            self._again_at = self._looks
        return again

    def look(self, half: int) -> None:
        """Before a round: which hosts to skip, *half* being half the prefetch target. A
        host skipped while others wait stays skipped as long as its slot is full and the
        buffer holds any of it: else, once one of its downloads ended, the round would
        lease back what was given back, and give it back again at the next."""
        others = self.others
        self._entries, self.held = [], 0
        self._looks += 1
        if half <= 0 or (len(self.buffer) < half and not others):
            self.skip = {}  # (most rounds: nothing to look at)
            return
        by_host: dict[str, list[Entry]] = {}
        for entry in self.buffer.movable():
            request = entry[-1]
            if not self._slot_free(request):  # its host, as the scripts name its back queue
                by_host.setdefault(url_host(request.url), []).append(entry)
        self.skip = {}
        # half the target held by such hosts together, not by one: three slow hosts each
        # below half filled the buffer, and the others' requests waited in Redis
        blocked = sum(len(entries) for entries in by_host.values()) >= half
        for host, entries in by_host.items():
            kept_skipped = others and host in self.sent  # (its requests may go back)
            if kept_skipped or blocked:
                self.skip[host] = -min(entries)[0]  # (an entry: minus its priority first)
                if kept_skipped:
                    self._entries += entries
        self.held = len(self._entries)

    def futile(self) -> bool:
        """A lease would bring nothing: Redis had only the skipped hosts' requests at the
        last sync, which skipped them already (its reply named no head)."""
        return bool(self.skip) and not self.named and self.skip.keys() <= self.sent.keys()

    def give_back(self, half: int) -> list[Request]:
        """The skipped hosts' buffered requests past the first *half* in line, taken out of
        the buffer (for their leases to go back to Redis), while other hosts' requests wait
        in Redis."""
        if not self.others or self.held <= half:
            return []
        self._entries.sort()
        gone, self._entries = self._entries[half:], self._entries[:half]
        self.held = half
        return self.buffer.remove(gone)
