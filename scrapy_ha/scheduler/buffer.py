"""The prefetch buffer: leased requests waiting for the engine, in priority order, and
how many to lease ahead."""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from scrapy_ha import metakeys
from scrapy_ha.scheduler import engine
from scrapy_ha.scheduler.engine.slots import capacity
from scrapy_ha.store.scripts import PRIORITY_STEP
from scrapy_ha.store.wire import clamp_priority

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from scrapy import Request
    from scrapy.crawler import Crawler

    from scrapy_ha.config.scheduler import SchedulerConfig
    from scrapy_ha.scheduler.engine.slots import SlotLoad
    from scrapy_ha.store.wire import NewEntry

#: A heap entry: a sort key whose last element carries the request.
E = TypeVar("E", bound="tuple[Any, ...]")
#: A buffered request's entry: minus its priority, its place within that priority, a
#: number unique to the entry (no two entries compare equal), the request.
Entry = tuple[int, int, int, "Request"]
#: The place within its priority of a request buffered without one (see Lease.place):
#: after every request leased with one, in arrival order.
UNPLACED = PRIORITY_STEP
#: Where the places of start requests kept in their own queue begin (lib/priority.lua).
START_PART = PRIORITY_STEP // 2

#: Leased requests per request the downloader can run at once: one running, one ready, so
#: that a small crawl with CONCURRENT_REQUESTS_PER_DOMAIN=1 spreads over the workers.
PER_SLOT_PREFETCH = 2


def prefetch_target(crawler: Crawler, config: SchedulerConfig, rate: float) -> int:
    """Requests to hold leased: two per request the downloader can run, within
    ``HA_PREFETCH``, and no more than this worker acks (*rate* per second) in half a lease
    period, so that none waits in the buffer until its lease expires."""
    enough = config.prefetch
    cap = min(enough, PER_SLOT_PREFETCH * capacity(crawler, enough))
    if rate > 0:
        cap = min(cap, max(1, int(rate * config.lease_time / 2)))
    return cap


class LeaseBuffer:
    """Leased requests waiting for the engine, highest priority first, then in Redis's order
    (the sequence part of their pending score: FIFO or LIFO, start requests last), across
    lease calls as within one; a request with a start time (its domain's rate), and one of
    a sharded crawl, after those, in lease order (see Scheduler.take).

    A request of higher priority than the head (leased after it) is handed out before it,
    as Scrapy's own priority queue would. Deque-like: ``append``, ``appendleft`` (first in
    line whatever its priority), ``popleft``, ``[0]``, iteration in no particular order.
    """

    def __init__(self, requests: Iterable[Request] = ()) -> None:
        self._heap: list[Entry] = []
        self._seq = itertools.count()
        self._front = itertools.count(-1, -1)
        for request in requests:
            self.append(request)

    def _key(self, request: Request, place: tuple[int, int] | None) -> Entry:
        seq = next(self._seq)
        if place is None:
            return (-clamp_priority(request.priority), UNPLACED, seq, request)
        return (*place, seq, request)

    def append(self, request: Request, place: tuple[int, int] | None = None) -> None:
        """Buffer *request*; *place*: its place in Redis's order (see Lease.place)."""
        heapq.heappush(self._heap, self._key(request, place))

    def appendleft(self, request: Request) -> None:
        top = self._heap[0][0] if self._heap else 0
        front = next(self._front)
        heapq.heappush(self._heap, (min(top, -request.priority), front, front, request))

    def popleft(self) -> Request:
        return heapq.heappop(self._heap)[-1]

    def take_first(self, ready: Callable[[Request], bool]) -> Request | None:
        """The first request in line for which *ready* is true (usually the head)."""
        if ready(self._heap[0][-1]):
            return self.popleft()
        for entry in sorted(self._heap)[1:]:
            if ready(entry[-1]):
                self._remove(entry)
                return entry[-1]
        return None

    def __getitem__(self, index: int) -> Request:
        if index != 0:
            raise IndexError("only the head of the buffer can be read")
        return self._heap[0][-1]

    def _head(self) -> Entry | None:
        return self._heap[0] if self._heap else None

    def head_priority(self) -> int | None:
        head = self._head()
        return None if head is None else -head[0]

    def last_priority(self) -> int | None:
        """The lowest priority buffered (None: empty)."""
        last = self._last()
        return None if last is None else -last[0]

    def _last(self) -> Entry | None:
        return max(self._heap) if self._heap else None

    def _entries(self) -> Iterable[Entry]:
        return self._heap

    def _remove(self, entry: Entry) -> None:
        self._heap.remove(entry)
        heapq.heapify(self._heap)

    def _to_give_back(self, place: tuple[int, int] | None) -> Entry | None:
        """The last entry in line of a lower priority than *place*'s, not a suspect (first
        in line whatever its priority), if any."""
        if place is None:
            return None
        lower = (e for e in self._entries() if e[0] > place[0])
        return max((e for e in lower if not e[-1].meta.get(metakeys.SUSPECT)), default=None)

    def movable(self) -> list[Entry]:
        """The entries that may be given back for a new request (:mod:`scrapy_ha.scheduler.keep`):
        all but the suspects (first in line whatever their priority) and those with a start
        time (their domain's rate slot is taken: given back, it would be lost)."""
        return [
            e for e in self._entries() if e[1] < UNPLACED and not e[-1].meta.get(metakeys.SUSPECT)
        ]

    def slot_of(self, request: Request) -> str:
        """The part of the buffer *request* is handed out from: one for all here."""
        return ""

    def remove(self, entries: list[Entry]) -> list[Request]:
        """Take *entries* out (for their leases to go back to Redis); return their requests."""
        for entry in entries:
            self._remove(entry)
        return [entry[-1] for entry in entries]

    def can_give_back(self, place: tuple[int, int] | None) -> bool:
        return self._to_give_back(place) is not None

    def give_back(self, place: tuple[int, int] | None) -> Request | None:
        """Take out the last request in line of a lower priority than the one Redis holds
        at *place* (see :meth:`_to_give_back`), for its lease to go back to Redis."""
        entry = self._to_give_back(place)
        if entry is None:
            return None
        self._remove(entry)
        return entry[-1]

    def outranked_by(self, top: int | None) -> bool:
        """A new request of priority *top* (on its way to Redis) goes before the head."""
        head = self.head_priority()
        return top is not None and head is not None and clamp_priority(top) > head

    def behind(self, place: tuple[int, int] | None) -> bool:
        """The request Redis holds at *place* (see Lease.place) is of a higher priority than
        the head, or of its priority and not a start request where the head is one kept in
        its own queue (Scrapy's start queues: a callback's request goes first). Else at equal
        priority the buffer goes first: see :meth:`FreshQueue.goes_before
        <scrapy_ha.scheduler.fresh.FreshQueue.goes_before>` for why."""
        head = self._head()
        if place is None or head is None or place[0] != head[0]:
            return place is not None and head is not None and place[0] < head[0]
        return place[1] < START_PART <= head[1] < UNPLACED

    def urgent(self, children: list[NewEntry], cap: int) -> int:
        """New requests of a higher priority than one buffered: to lease now, over the
        target, so that they are handed out before it (as from Scrapy's own priority queue,
        where a request queued after another of lower priority still comes out first); at
        most *cap*."""
        last = self.last_priority()
        if last is None:
            return 0
        return min(cap, sum(clamp_priority(e.priority) > last for e in children))

    def drop(self, lost: set[tuple[str, str]]) -> int:
        """Drop the requests of the leases *lost*, (id, token) pairs; return how many."""
        before = len(self._heap)
        kept = [e for e in self._heap if tuple(e[-1].meta[metakeys.LEASE]) not in lost]
        self._heap = kept
        heapq.heapify(self._heap)
        return before - len(kept)

    def clear(self) -> None:
        self._heap.clear()

    def __iter__(self) -> Iterator[Request]:
        return (entry[-1] for entry in self._heap)

    def __len__(self) -> int:
        return len(self._heap)


class SlotChooser:
    """Download slots as DownloaderAwarePriorityQueue sees them: a request's slot key, and
    how busy a slot is (what it runs plus what this worker handed to it)."""

    def __init__(self, crawler: Crawler, load: SlotLoad) -> None:
        self._crawler = crawler
        self._load = load

    def key(self, request: Request) -> str:
        downloader = getattr(engine._engine(self._crawler), "downloader", None)
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
        if len(self._heaps) <= 1:  # nothing to compare: no slot's load asked
            return list(self._heaps)
        load = self.chooser.load
        return sorted(self._heaps, key=lambda key: (load(key), key))

    def n_slots(self) -> int:
        return len(self._heaps)

    def head_slot(self) -> str | None:
        if len(self._heaps) <= 1:
            # one slot is the head whatever its load: a crawl of one site asks none (the
            # load is the slot's requests on their way, looked at twice or more a page)
            return next(iter(self._heaps), None)
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


def _request(entry: Entry) -> Request:
    return entry[-1]


class FairLeaseBuffer(LeaseBuffer):
    """A :class:`LeaseBuffer` that hands out as DownloaderAwarePriorityQueue: from the least
    busy download slot first, by priority then lease order within a slot; distinct hosts
    come out a, b, c, a, b, c, not a, a, b, b, c, c."""

    def __init__(self, chooser: SlotChooser, requests: Iterable[Request] = ()) -> None:
        self._fair: FairHeap[Entry] = FairHeap(chooser, _request)
        super().__init__(requests)

    def append(self, request: Request, place: tuple[int, int] | None = None) -> None:
        self._fair.push(self._key(request, place))

    def appendleft(self, request: Request) -> None:
        first = self._fair.peek(self._fair.chooser.key(request))
        top = first[0] if first is not None else 0
        front = next(self._front)
        self._fair.push((min(top, -request.priority), front, front, request))

    def popleft(self) -> Request:
        return self._fair.pop()[-1]

    def take_first(self, ready: Callable[[Request], bool]) -> Request | None:
        """The head of the least busy slot whose head is *ready*."""
        head = self._fair.head_slot()
        if head is None:
            return None
        if ready(self._fair.top(head)[-1]):
            return self._fair.pop(head)[-1]
        for slot in self._fair.slots():
            if ready(self._fair.top(slot)[-1]):
                return self._fair.pop(slot)[-1]
        return None

    def __getitem__(self, index: int) -> Request:
        entry = self._fair.peek() if index == 0 else None
        if entry is None:
            raise IndexError("only the head of the buffer can be read")
        return entry[-1]

    def _head(self) -> Entry | None:
        return self._fair.peek()

    def _last(self) -> Entry | None:
        return max(self._fair) if len(self._fair) else None

    def _entries(self) -> Iterable[Entry]:
        return self._fair

    def _remove(self, entry: Entry) -> None:
        self._fair.keep(lambda e: e is not entry)

    def slot_of(self, request: Request) -> str:
        """Its download slot: each slot hands out from its own head."""
        return self._fair.chooser.key(request)

    def behind(self, place: tuple[int, int] | None) -> bool:
        """As :meth:`LeaseBuffer.behind` while one download slot is buffered; with several,
        the least busy slot goes first whatever Redis holds (Redis does not know the slot
        of its head, which may be a busy one)."""
        return self._fair.n_slots() <= 1 and super().behind(place)

    def drop(self, lost: set[tuple[str, str]]) -> int:
        before = len(self._fair)
        self._fair.keep(lambda e: tuple(e[-1].meta[metakeys.LEASE]) not in lost)
        return before - len(self._fair)

    def clear(self) -> None:
        self._fair.clear()

    def __iter__(self) -> Iterator[Request]:
        return (entry[-1] for entry in self._fair)

    def __len__(self) -> int:
        return len(self._fair)
