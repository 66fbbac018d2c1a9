"""The prefetch buffer: leased requests waiting for the engine, in priority order, and
how many to lease ahead."""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING

from scrapy_ha import _engine, metakeys

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from scrapy import Request
    from scrapy.crawler import Crawler

    from scrapy_ha._queue import NewEntry
    from scrapy_ha.config import SchedulerConfig

#: Leased requests per request the downloader can run at once: one running, one ready, so
#: that a small crawl with CONCURRENT_REQUESTS_PER_DOMAIN=1 spreads over the workers.
PER_SLOT_PREFETCH = 2


def prefetch_target(crawler: Crawler, config: SchedulerConfig, rate: float) -> int:
    """Requests to hold leased: two per request the downloader can run, within
    ``HA_PREFETCH``, and no more than this worker acks (*rate* per second) in half a lease
    period, so that none waits in the buffer until its lease expires."""
    enough = config.prefetch
    cap = min(enough, PER_SLOT_PREFETCH * _engine.capacity(crawler, enough))
    if rate > 0:
        cap = min(cap, max(1, int(rate * config.lease_time / 2)))
    return cap


class LeaseBuffer:
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

    def outranked_by(self, top: int | None) -> bool:
        """A request waiting to be queued, of priority *top*, outranks the head."""
        head = self.head_priority()
        return top is not None and head is not None and top > head

    def urgent(self, children: list[NewEntry], cap: int) -> int:
        """New requests that outrank the head: to lease now, over the target, so that they
        are handed out before it (as from Scrapy's own priority queue); at most *cap*."""
        head = self.head_priority()
        if head is None:
            return 0
        return min(cap, sum(1 for entry in children if entry.priority > head))

    def drop(self, lost: set[tuple[str, str]]) -> int:
        """Drop the requests of the leases *lost*, (id, token) pairs; return how many."""
        before = len(self._heap)
        kept = [e for e in self._heap if tuple(e[2].meta[metakeys.LEASE]) not in lost]
        self._heap = kept
        heapq.heapify(self._heap)
        return before - len(kept)

    def clear(self) -> None:
        self._heap.clear()

    def __iter__(self) -> Iterator[Request]:
        return (entry[2] for entry in self._heap)

    def __len__(self) -> int:
        return len(self._heap)
