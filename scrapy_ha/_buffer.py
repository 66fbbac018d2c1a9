"""The prefetch buffer: leased requests waiting for the engine, in priority order, and
how many to lease ahead."""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from scrapy_ha import _engine, metakeys

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from scrapy import Request
    from scrapy.crawler import Crawler

    from scrapy_ha._queue import NewEntry
    from scrapy_ha.config import SchedulerConfig

#: A heap entry: a sort key whose last element carries the request.
E = TypeVar("E", bound="tuple[Any, ...]")

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


class SlotChooser:
    """Download slots as DownloaderAwarePriorityQueue sees them: a request's slot key, and
    how busy a slot is (what it runs plus what this worker handed to it)."""

    def __init__(self, crawler: Crawler, load: _engine.SlotLoad) -> None:
        self._crawler = crawler
        self._load = load

    def key(self, request: Request) -> str:
        downloader = getattr(_engine._engine(self._crawler), "downloader", None)
        return "" if downloader is None else str(downloader.get_slot_key(request))

    def load(self, key: str) -> int:
        return self._load.load(self._crawler, key)


class FairHeap(Generic[E]):
    """One heap per download slot; the head is the head of the least busy slot (ties: the
    lowest slot key), as DownloaderAwarePriorityQueue picks. Finding it looks at each slot
    once, O(slots) as in Scrapy, and sorts nothing; within a slot, heap order."""

    def __init__(self, chooser: SlotChooser, request_of: Callable[[E], Request]) -> None:
        self.chooser = chooser
        self._request_of = request_of
        self._heaps: dict[str, list[E]] = {}
        self._len = 0

    def push(self, entry: E) -> None:
        key = self.chooser.key(self._request_of(entry))
        heapq.heappush(self._heaps.setdefault(key, []), entry)
        self._len += 1

    def slots(self) -> list[str]:
        """The slots that hold entries, least busy first."""
        load = self.chooser.load
        return sorted(self._heaps, key=lambda key: (load(key), key))

    def head_slot(self) -> str | None:
        if not self._heaps:
            return None
        load = self.chooser.load
        return min(self._heaps, key=lambda key: (load(key), key))

    def peek(self, slot: str | None = None) -> E | None:
        """The head entry (of *slot*, else of the least busy slot); None if none."""
        slot = self.head_slot() if slot is None else slot
        heap = None if slot is None else self._heaps.get(slot)
        return heap[0] if heap else None

    def pop(self, slot: str | None = None) -> E:
        slot = self.head_slot() if slot is None else slot
        if slot is None:
            raise IndexError("pop from an empty buffer")
        heap = self._heaps[slot]
        entry = heapq.heappop(heap)
        if not heap:
            del self._heaps[slot]
        self._len -= 1
        return entry

    def top(self, slot: str) -> E:
        return self._heaps[slot][0]

    def keep(self, wanted: Callable[[E], bool]) -> None:
        """Keep only the entries *wanted*."""
        for key, heap in list(self._heaps.items()):
            kept = [entry for entry in heap if wanted(entry)]
            self._len -= len(heap) - len(kept)
            if kept:
                heapq.heapify(kept)
                self._heaps[key] = kept
            else:
                del self._heaps[key]

    def clear(self) -> None:
        self._heaps.clear()
        self._len = 0

    def __iter__(self) -> Iterator[E]:
        return (entry for heap in self._heaps.values() for entry in heap)

    def __len__(self) -> int:
        return self._len


def _request(entry: tuple[int, int, Request]) -> Request:
    return entry[2]


class FairLeaseBuffer(LeaseBuffer):
    """A :class:`LeaseBuffer` that hands out as DownloaderAwarePriorityQueue: from the least
    busy download slot first, by priority then lease order within a slot; distinct hosts
    come out a, b, c, a, b, c, not a, a, b, b, c, c."""

    def __init__(self, chooser: SlotChooser, requests: Iterable[Request] = ()) -> None:
        self._fair: FairHeap[tuple[int, int, Request]] = FairHeap(chooser, _request)
        super().__init__(requests)

    def append(self, request: Request) -> None:
        self._fair.push((-request.priority, next(self._seq), request))

    def appendleft(self, request: Request) -> None:
        first = self._fair.peek(self._fair.chooser.key(request))
        top = first[0] if first is not None else 0
        self._fair.push((min(top, -request.priority), next(self._front), request))

    def popleft(self) -> Request:
        return self._fair.pop()[2]

    def take_first(self, ready: Callable[[Request], bool]) -> Request | None:
        """The head of the least busy slot whose head is *ready*."""
        head = self._fair.head_slot()
        if head is None:
            return None
        if ready(self._fair.top(head)[2]):
            return self._fair.pop(head)[2]
        for slot in self._fair.slots():
            if ready(self._fair.top(slot)[2]):
                return self._fair.pop(slot)[2]
        return None

    def __getitem__(self, index: int) -> Request:
        entry = self._fair.peek() if index == 0 else None
        if entry is None:
            raise IndexError("only the head of the buffer can be read")
        return entry[2]

    def head_priority(self) -> int | None:
        entry = self._fair.peek()
        return None if entry is None else -entry[0]

    def drop(self, lost: set[tuple[str, str]]) -> int:
        before = len(self._fair)
        self._fair.keep(lambda e: tuple(e[2].meta[metakeys.LEASE]) not in lost)
        return before - len(self._fair)

    def clear(self) -> None:
        self._fair.clear()

    def __iter__(self) -> Iterator[Request]:
        return (entry[2] for entry in self._fair)

    def __len__(self) -> int:
        return len(self._fair)
