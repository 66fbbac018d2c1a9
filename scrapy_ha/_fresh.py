"""This worker's own new requests, handed to its engine before Redis has them.

A request a callback yields goes to Redis in the background task's next round; waiting for
that round before the engine may have it would make ``next_request()`` answer None while a
request is pending (``scheduler_empty`` fires, and a pagination chain costs two rounds per
page). So a new request waits in a :class:`FreshQueue` as well as in the outbox, and
``next_request()`` may hand it out at once, with a lease this worker makes itself
(:class:`LeaseMaker`). The next round stores it in Redis already leased to this worker.

Nothing is lost: its parent is acked only after it is stored (children before acks). But
only Redis knows whether it duplicates a request another worker (or an earlier run)
enqueued, so its download waits for that round's verdict: :class:`DownloadGate`, first in
the downloader middleware chain, holds a fresh request until the round stored it (go on)
or refused it (dropped as Scrapy drops a duplicate: ``request_dropped``, no download, no
errback). Any other request passes the gate at once.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import secrets
from typing import TYPE_CHECKING

from scrapy_ha import metakeys
from scrapy_ha._buffer import FairHeap

if TYPE_CHECKING:
    from collections.abc import Coroutine
    from typing import Any

    from scrapy import Request

    from scrapy_ha._buffer import SlotChooser
    from scrapy_ha._outbox import Pair
    from scrapy_ha._queue import Fresh

#: Random bytes naming this worker's own leases: 64 bits, never the 48-bit nonce of a
#: Redis-made token (so the two kinds never collide), and two workers share one with odds
#: ~1e-19.
NONCE_BYTES = 8


class LeaseMaker:
    """Entry ids and lease tokens made by this worker: ``<nonce>.<n>`` and ``<nonce>-<n>``.

    The nonce is random per scheduler, so they are unique for the life of the data, across
    restarts, flushes and failovers (a Redis-made id is a number: the two never meet)."""

    def __init__(self) -> None:
        self.nonce = secrets.token_hex(NONCE_BYTES)
        self._count = itertools.count(1)

    def __call__(self) -> Pair:
        n = next(self._count)
        return f"{self.nonce}.{n}", f"{self.nonce}-{n}"


def _is_start(request: Request) -> bool:
    return bool(request.meta.get("is_start_request"))


def _gone(fresh: Fresh) -> bool:
    return fresh.sealed or fresh.lease is not None


def _fresh_request(entry: tuple[int, bool, int, Fresh]) -> Request:
    return entry[3].request


class FreshQueue:
    """New requests not sent to Redis yet, in the order of Scrapy's own scheduler: priority
    first; at equal priority, requests from callbacks before start requests; then each kind
    in its own order: LIFO or FIFO (the crawl's ``HA_QUEUE_ORDER``) for callbacks, FIFO
    for start requests unless ``SCHEDULER_START_MEMORY_QUEUE`` is a LIFO queue. A request
    leaves it when handed out or when a round sends it to Redis (``sealed``)."""

    def __init__(
        self, *, lifo: bool, start_lifo: bool = False, fair: SlotChooser | None = None
    ) -> None:
        self.lifo = lifo
        self.start_lifo = start_lifo
        self._heap: list[tuple[int, bool, int, Fresh]] = []
        self._seq = itertools.count()
        # DownloaderAwarePriorityQueue's order: the least busy download slot first
        self._fair = None if fair is None else FairHeap(fair, _fresh_request)

    def push(self, fresh: Fresh) -> None:
        seq = next(self._seq)
        start = _is_start(fresh.request)
        lifo = self.start_lifo if start else self.lifo
        key = (-fresh.request.priority, start, -seq if lifo else seq, fresh)
        if self._fair is not None:
            self._fair.push(key)
            return
        heapq.heappush(self._heap, key)

    def head(self) -> Fresh | None:
        """The first request in line (None if none), skipping those gone to Redis."""
        if self._fair is not None:
            while (entry := self._fair.peek()) is not None and _gone(entry[3]):
                self._fair.pop()
            return None if entry is None else entry[3]
        heap = self._heap
        while heap and (heap[0][3].sealed or heap[0][3].lease is not None):
            heapq.heappop(heap)
        return heap[0][3] if heap else None

    def pop(self) -> None:
        if self._fair is not None:
            self._fair.pop()
            return
        heapq.heappop(self._heap)

    def goes_before(self, fresh: Fresh, leased: Request | None) -> bool:
        """Does *fresh* come before *leased*, the head of the lease buffer (None: none)?

        By priority, then a callback's request before a start request. At equal priority
        and kind the leased one goes first, even in a LIFO order where the newer fresh one
        would: a worker that always preferred its own new requests would never drain its
        buffer, whose leases other workers cannot have meanwhile (and lose a lease period
        if it dies)."""
        if leased is None:
            return True
        if self._fair is not None:  # the less busy slot first, as DownloaderAware... does
            slot = self._fair.chooser
            mine_slot, their_slot = slot.key(fresh.request), slot.key(leased)
            if mine_slot != their_slot:
                return (slot.load(mine_slot), mine_slot) < (slot.load(their_slot), their_slot)
        mine, theirs = fresh.request.priority, leased.priority
        if mine != theirs:
            return mine > theirs
        return _is_start(leased) and not _is_start(fresh.request)

    def prune(self) -> None:
        """Forget the requests a round sent (they come back by lease)."""
        if self._fair is not None:
            self._fair.keep(lambda entry: not _gone(entry[3]))
            return
        self._heap = [e for e in self._heap if not (e[3].sealed or e[3].lease is not None)]
        heapq.heapify(self._heap)

    def clear(self) -> None:
        self._heap.clear()
        if self._fair is not None:
            self._fair.clear()

    def __len__(self) -> int:
        return len(self._heap) if self._fair is None else len(self._fair)


class DownloadGate:
    """Holds the download of a request handed out before Redis had it until the round that
    stores it says whether it was stored (see the module docstring).

    Installed first in the downloader middleware chain (:func:`scrapy_ha._engine.gate_downloads`):
    :meth:`process_request` returns None at once for any request it does not wait for.
    """

    def __init__(self) -> None:
        self.installed = False
        #: handed out, verdict not known: None, a future the gate awaits, or the verdict
        self._waiting: dict[Pair, asyncio.Future[bool] | bool | None] = {}
        self._dropping: dict[int, Request] = {}

    def expect(self, pair: Pair) -> None:
        if self.installed:
            self._waiting[pair] = None

    def settle(self, pair: Pair, *, stored: bool) -> None:
        """The round's verdict on *pair*: stored (and leased to this worker), or not."""
        if pair not in self._waiting:
            return
        state = self._waiting[pair]
        if isinstance(state, asyncio.Future):
            del self._waiting[pair]
            if not state.done():
                state.set_result(stored)
        else:
            self._waiting[pair] = stored

    def process_request(self, request: Request) -> Coroutine[Any, Any, Request | None] | None:
        """None (download it) unless *request* waits for its verdict: then a coroutine that
        gives None once it is stored, or *request* itself if it was not (the engine
        schedules it again, and :meth:`dropped` makes the scheduler refuse it)."""
        if not self._waiting:
            return None
        lease = request.meta.get(metakeys.LEASE)
        pair = (str(lease[0]), str(lease[1])) if lease else None
        if pair is None or pair not in self._waiting:
            return None
        state = self._waiting[pair]
        if isinstance(state, bool):
            del self._waiting[pair]
            return None if state else self._turn_back(request)
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting[pair] = future
        return self._await(request, future)

    async def _await(self, request: Request, verdict: asyncio.Future[bool]) -> Request | None:
        if await verdict:
            return None
        return await self._turn_back(request)

    async def _turn_back(self, request: Request) -> Request:
        self._dropping[id(request)] = request
        return request

    def dropped(self, request: Request) -> bool:
        """True (once) for a request the gate turned back: the scheduler refuses it."""
        return self._dropping.pop(id(request), None) is not None
