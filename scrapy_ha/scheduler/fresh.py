"""This worker's own new requests, handed to its engine before Redis has them.

A request a callback yields goes to Redis in the background task's next round; waiting for
that round before the engine may have it would make ``next_request()`` answer None while a
request is pending (``scheduler_empty`` fires, and a pagination chain costs two rounds per
page). So a new request waits in a :class:`FreshQueue` as well as in the outbox, and
``next_request()`` may hand it out at once, with a lease this worker makes itself
(:class:`LeaseMaker`). The next round stores it in Redis already leased to this worker.

Nothing is lost: its parent is acked only after it is stored (children before acks). But
only Redis knows whether it duplicates a request another worker (or an earlier run)
enqueued, so what comes of it waits for that round's verdict (:mod:`scrapy_ha.scheduler.gate`).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import secrets
from typing import TYPE_CHECKING

from scrapy_ha import metakeys
from scrapy_ha.scheduler import engine
from scrapy_ha.scheduler.buffer import FairHeap
from scrapy_ha.scheduler.gate import DownloadGate
from scrapy_ha.store.dictionary import Compactor

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.crawler import Crawler

    from scrapy_ha.scheduler.buffer import SlotChooser
    from scrapy_ha.scheduler.engine.slots import SlotLoad
    from scrapy_ha.scheduler.inflight import InFlight
    from scrapy_ha.scheduler.keep import Keep
    from scrapy_ha.scheduler.outbox import Outbox, Pair
    from scrapy_ha.store.wire import Fresh, NewEntry

logger = logging.getLogger("scrapy_ha.scheduler")

#: Looks of the engine a round waits for at most before it sends new requests to Redis
#: (see Handout.offer): one is enough unless start() keeps yielding meanwhile.
OFFER_LOOKS = 4
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
        self,
        *,
        lifo: bool,
        start_lifo: bool = False,
        fair: SlotChooser | None = None,
        keep: Keep | None = None,
    ) -> None:
        self.lifo = lifo
        self.start_lifo = start_lifo
        self.keep = keep
        self._heap: list[tuple[int, bool, int, Fresh]] = []
        self._seq = itertools.count()
        # DownloaderAwarePriorityQueue's order: the least busy download slot first
        self._fair = None if fair is None else FairHeap(fair, _fresh_request)

    def push(self, fresh: Fresh) -> None:
        seq = next(self._seq)
        start = bool(fresh.request.meta.get("is_start_request"))  # (_is_start, inlined: hot)
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
        and kind, the newer one in a LIFO crawl whose worker is alone (it keeps its new
        requests: :mod:`scrapy_ha.scheduler.keep`); else the leased one, even in a LIFO order: a
        worker that always preferred its own new requests would never drain its buffer,
        whose leases other workers cannot have meanwhile (and lose a lease period if it
        dies)."""
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
        start = _is_start(fresh.request)
        if _is_start(leased) != start:
            return not start
        return not start and self.keep is not None and self.keep.active()

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


class Handout:
    """The scheduler's side of the hand-out from memory: new requests wait in a
    :class:`FreshQueue` and go to the engine under a lease made here (:meth:`hand`); each
    round seals the ones it sends (:meth:`seal`) and settles those handed out by Redis's
    verdict (:meth:`settle`), which its :class:`~scrapy_ha.scheduler.gate.DownloadGate` passes on
    to the download."""

    def __init__(
        self,
        crawler: Crawler,
        outbox: Outbox,
        inflight: InFlight,
        slots: SlotLoad,
        wake: Callable[[], None],
        *,
        queue: FreshQueue,
        early: bool = True,
        compactor: Compactor | None = None,
    ) -> None:
        self.crawler = crawler
        self.queue = queue
        self.compactor = Compactor(enabled=False) if compactor is None else compactor
        assert crawler.stats is not None
        self.gate = DownloadGate(crawler.stats, early=early)
        self.unstored: set[Pair] = set()  # handed out, not stored in Redis yet
        self._outbox = outbox
        self._inflight = inflight
        self._slots = slots
        self._wake = wake
        self._make_lease = LeaseMaker()
        # requests queued, and how many of them the engine had been offered when it last
        # called next_request() (see offer)
        self._pushed = self._offered = 0
        self._log = _logs_debug(crawler)

    def push(self, fresh: Fresh, parent: Pair | None) -> None:
        """Queue *fresh*, yielded by the page under the lease *parent* (None: a root). A
        link of a page this worker redoes is marked now, while that page is held: it is
        handed out later, often once the page is done (see DownloadGate.expect)."""
        if parent is not None and self.gate.guard.redone(parent[0]):
            fresh.late = True
        self.queue.push(fresh)
        self._pushed += 1

    def looked(self) -> None:
        """The engine called ``next_request()``: it was offered everything queued so far,
        and has taken the request handed out before (in its downloader now, or done)."""
        self._offered = self._pushed
        self._slots.taken()

    def has_fresh(self) -> bool:
        """New requests wait to be handed out from memory."""
        return self.queue.head() is not None

    def first(self, leased: Request | None, can_go: Callable[[Request], bool]) -> Fresh | None:
        """The first new request, if it comes before *leased* (the head of the lease
        buffer, None: none) and *can_go* now."""
        fresh = self.queue.head()
        if fresh is None or not self.queue.goes_before(fresh, leased):
            return None
        return fresh if can_go(fresh.request) else None

    def hand(self, fresh: Fresh) -> Request:
        """Hand out *fresh* (the head) under a lease made here: the next round stores it
        leased to this worker."""
        self.queue.pop()
        request = fresh.request
        pair = fresh.lease = self._make_lease()
        meta = request.meta
        meta[metakeys.LEASE] = pair
        # It is its own page now, as a request leased from Redis is (the codec strips the
        # parent's lease): its redirects and retries are fenced by its lease, which it holds
        # until it is finished, not by the parent's, which may be acked before it downloads.
        meta.pop(metakeys.PARENT, None)
        self.unstored.add(pair)
        self.gate.expect(pair, late=fresh.late)
        self._inflight.add(pair[0], pair[1], request, stored=False)
        self._slots.handed(self.crawler, request)
        if self._log:  # a LogRecord per request costs, even when filtered out
            logger.debug("Handed out %s before Redis has it (lease %s)", request, pair[1])
        self._wake()
        return request

    async def offer(self) -> None:
        """Before new requests go to Redis: let the engine take those it has room for.

        A request queued while the engine has room is handed out from memory at the
        engine's next look, in Scrapy's order; sent to Redis first, it would come back
        behind everything queued meanwhile. The engine looks a turn of the event loop or
        two after an enqueue, and the background task may run first (it resumes in the
        same turn, or is already past its own wait): so it makes the engine look, and
        waits for it, until the engine has been offered every request queued so far or
        has no room left. Bounded (``OFFER_LOOKS``): a start() that yields a request
        every turn must not hold the round back."""
        for _ in range(OFFER_LOOKS):
            if self._offered >= self._pushed or not self.has_fresh():
                return
            if not engine.has_room(self.crawler):
                return
            await engine.look(self.crawler)

    def seal(self, batch: list[NewEntry], *, keep: bool = True) -> int:
        """*batch* goes to Redis now: its new requests not handed out leave the queue (they
        go pending, and come back by lease, or with *keep* are kept if they may be:
        :mod:`scrapy_ha.scheduler.keep`); return how many are kept.

        They are compacted now (``HA_COMPACT_PAYLOADS``), not as each was admitted, but
        those handed out: stored leased to this worker and acked once done, compacted they
        would save Redis's memory for that while only, at a cost per request
        (docs/benchmarks.md, "Compacted as they go pending"). A kept one is compacted: it
        goes back pending when newer requests crowd it out of the buffer."""
        keeper = self.queue.keep if keep else None
        kept = keeper.choose(batch, self._make_lease) if keeper is not None else 0
        pending = self.compactor.pending if self.compactor.dictionary is not None else None
        for entry in batch:
            fresh = entry.fresh
            if fresh is not None and not fresh.sealed:
                fresh.sealed = True
                if fresh.lease is None:
                    self._outbox.note_priority(entry.priority)
            if pending is not None and (fresh is None or fresh.lease is None or fresh.kept):
                entry.payload = pending(entry.payload)
        self.queue.prune()
        return kept

    def settle(self, batch: list[NewEntry], dropped: set[str]) -> None:
        """Redis has *batch*: a request handed out from it was stored leased to this worker
        (its download goes on), or not (*dropped*: a duplicate, or its page's lease was
        lost): then it is cancelled and forgotten, never acked."""
        leased = handed = kept = 0
        gate = self.gate
        for entry in batch:
            fresh = entry.fresh  # (entry.taken and entry.kept, read once: per request)
            if fresh is None or (pair := fresh.lease) is None:
                continue
            stored = pair[0] not in dropped
            if fresh.kept:
                assert self.queue.keep is not None
                self.queue.keep.landed(fresh, stored=stored)
                kept += stored
                continue
            handed += 1  # counted here, once per round, not at each hand-out (hot path)
            self.unstored.discard(pair)
            if stored:  # stored marked as handed: no early report is needed
                leased += 1
            else:
                self._inflight.discard(pair[0])
            gate.settle(pair, stored=stored)
        gate.guard.note(handed, leased)
        stats = self.crawler.stats
        assert stats is not None
        if handed:
            stats.inc_value("ha/handed_fresh", handed)
        if kept:
            stats.inc_value("ha/kept", kept)
        if leased + kept:
            stats.inc_value("ha/leased", leased + kept)

    def clear(self) -> None:
        self.queue.clear()
        self.unstored.clear()


def _logs_debug(crawler: Crawler) -> bool:
    """Scrapy's LOG_LEVEL is DEBUG (it filters in its handler: the loggers pass everything)."""
    level = crawler.settings.get("LOG_LEVEL", "DEBUG")
    return level == logging.DEBUG or str(level).upper() == "DEBUG"
