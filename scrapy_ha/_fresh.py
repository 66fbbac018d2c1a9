"""This worker's own new requests, handed to its engine before Redis has them.

A request a callback yields goes to Redis in the background task's next round; waiting for
that round before the engine may have it would make ``next_request()`` answer None while a
request is pending (``scheduler_empty`` fires, and a pagination chain costs two rounds per
page). So a new request waits in a :class:`FreshQueue` as well as in the outbox, and
``next_request()`` may hand it out at once, with a lease this worker makes itself
(:class:`LeaseMaker`). The next round stores it in Redis already leased to this worker.

Nothing is lost: its parent is acked only after it is stored (children before acks). But
only Redis knows whether it duplicates a request another worker (or an earlier run)
enqueued, so what comes of it waits for that round's verdict (:class:`DownloadGate`): it
goes on if the round stored it, and is dropped as Scrapy drops a duplicate if not
(``request_dropped``, no callback, no errback). With ``HA_EARLY_DOWNLOAD`` a GET or HEAD
downloads meanwhile, while :class:`EarlyGuard` allows it: its response
(or error) waits for the verdict before any downloader middleware sees it, so the round
trip overlaps the download instead of preceding it. Any other request waits for the
verdict before its download starts. Any request not handed out this way passes the gate
at once.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import secrets
from typing import TYPE_CHECKING

from scrapy_ha import _engine, metakeys
from scrapy_ha._buffer import FairHeap

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine
    from typing import Any

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.statscollectors import StatsCollector

    from scrapy_ha._buffer import SlotChooser
    from scrapy_ha._inflight import InFlight
    from scrapy_ha._keep import Keep
    from scrapy_ha._outbox import Outbox, Pair
    from scrapy_ha._queue import Fresh, NewEntry

logger = logging.getLogger("scrapy_ha.scheduler")

#: Looks of the engine a round waits for at most before it sends new requests to Redis
#: (see Handout.offer): one is enough unless start() keeps yielding meanwhile.
OFFER_LOOKS = 4
#: Random bytes naming this worker's own leases: 64 bits, never the 48-bit nonce of a
#: Redis-made token (so the two kinds never collide), and two workers share one with odds
#: ~1e-19.
NONCE_BYTES = 8
#: Methods whose download may start before the round's verdict: fetching one that Redis
#: then refuses costs a download, never a callback, and does nothing to the site.
EARLY_METHODS = frozenset({"GET", "HEAD"})
#: New requests the early-download guard looks back over: half of it before it opens, at
#: most the whole (a count that halves as it grows past it).
EARLY_WINDOW = 200
#: The share of those Redis may have refused (duplicates, fenced children) for downloads
#: to start before the verdict: each such download is one the site did not need to serve.
EARLY_MAX_REFUSED = 0.01


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
        and kind, the newer one in a LIFO crawl whose worker is alone (it keeps its new
        requests: :mod:`scrapy_ha._keep`); else the leased one, even in a LIFO order: a
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


class EarlyGuard:
    """May a fresh GET download before Redis's verdict? Not while this worker redoes a page
    another worker (or an earlier run of this one) left unfinished: a lease taken after it
    expired, held until it ends; its page's links are likely in Redis already (stored by
    the worker that died), and each would be downloaded for nothing. Otherwise only while
    Redis refused at most ``EARLY_MAX_REFUSED`` of the last ``EARLY_WINDOW`` or so
    requests this worker handed out before Redis had them (a duplicate another worker or
    an earlier run had, a child of a lease lost), and not before it has seen half that
    many. A crawl where workers yield the same links, or a re-run of a persisted crawl,
    keeps every download waiting for its verdict; a crawl of new pages (a catalogue, a
    pagination chain) downloads them a round trip sooner."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        #: the leases this worker holds (set by the scheduler)
        self.held: Callable[[], list[Pair]] = list
        self._sent = 0.0
        self._refused = 0.0
        self._redoing: set[str] = set()

    def note(self, sent: int, stored: int) -> None:
        """A round gave its verdict on *sent* requests handed out: *stored* were stored."""
        self._sent += sent
        self._refused += sent - stored
        while self._sent > EARLY_WINDOW:
            self._sent /= 2
            self._refused /= 2

    def redo(self, entry_id: str) -> None:
        """This worker took a lease that had expired before (*entry_id*)."""
        if self.enabled:
            self._redoing.add(entry_id)

    def allows(self) -> bool:
        if self._redoing:
            self._redoing.intersection_update(pair[0] for pair in self.held())
            if self._redoing:
                return False
        return (
            self.enabled
            and self._sent >= EARLY_WINDOW / 2
            and self._refused <= self._sent * EARLY_MAX_REFUSED
        )


#: A fresh request downloading before its verdict (see DownloadGate._waiting).
_EARLY = "early"


class DownloadGate:
    """Holds what comes of a request handed out before Redis had it until the round that
    stores it says whether it was stored (see the module docstring).

    Installed at both ends of the downloader middleware chain
    (:func:`scrapy_ha._engine.gate_downloads`): :meth:`process_request` first, which lets
    a GET or HEAD go on (the :class:`EarlyGuard` permitting) and holds any other request
    until its verdict; :meth:`process_response` and :meth:`process_exception` nearest the
    downloader, which hold a response or an error until its verdict. Each returns None or
    its input at once for any request it does not wait for.
    """

    def __init__(self, stats: StatsCollector, *, early: bool = True) -> None:
        self.installed = False
        self.guard = EarlyGuard(early)
        self._stats = stats
        #: handed out, verdict not known: None (not at the gate yet), _EARLY (downloading),
        #: a future the gate awaits; or the verdict, until process_request takes it
        self._waiting: dict[Pair, asyncio.Future[bool] | bool | str | None] = {}
        #: those whose download started before their verdict, until it comes
        self._early: set[Pair] = set()
        #: early downloads Redis refused, until their response, their error or a copy of
        #: their request (a middleware's, e.g. a proxy's wait) comes back: turned back
        self._refused: set[Pair] = set()
        self._dropping: dict[int, Request] = {}

    def expect(self, pair: Pair) -> None:
        if self.installed:
            self._waiting[pair] = None

    def settle(self, pair: Pair, *, stored: bool) -> None:
        """The round's verdict on *pair*: stored (and leased to this worker), or not."""
        if pair not in self._waiting:
            return
        state = self._waiting[pair]
        early = pair in self._early
        if early:
            self._early.discard(pair)
            if not stored:
                self._stats.inc_value("ha/early_dropped")
        if isinstance(state, asyncio.Future):
            del self._waiting[pair]
            if not state.done():
                state.set_result(stored)
        elif early:  # its response, its error or a copy of its request comes later
            del self._waiting[pair]
            if not stored:
                self._refused.add(pair)
        else:
            self._waiting[pair] = stored

    def open_all(self) -> None:
        """Let every download waiting for a verdict go on, and hold no request from now on:
        no round will come (the spider closes, or the background task gave up), and the
        last flush stores them before any ack. A verdict already given stands. Should that
        flush find one a duplicate, it was crawled twice: the lesser harm, since turned
        back it would be lost (its page is acked once the flush ends)."""
        self.installed = False
        for pair, state in list(self._waiting.items()):
            if not isinstance(state, bool):
                self.settle(pair, stored=True)

    def replaced(self, request: Request) -> None:
        """The scheduler took *request* as the retry of a request it holds: when a
        middleware gave it back in place of an early download (a proxy middleware's wait),
        nothing of that download comes back to the gate."""
        pair = _pair(request)
        if pair in self._early and self._waiting.get(pair) == _EARLY:
            del self._waiting[pair]
            self._early.discard(pair)

    def process_request(
        self, request: Request
    ) -> Coroutine[Any, Any, Request | Response | None] | None:
        """None (download it) unless *request* waits for its verdict: then a coroutine that
        gives None once it is stored, or *request* itself if it was not (the engine
        schedules it again, and :meth:`dropped` makes the scheduler refuse it)."""
        if not self._waiting:
            return None
        pair = _pair(request)
        if pair is None or pair not in self._waiting:
            return None
        state = self._waiting[pair]
        if isinstance(state, bool):
            del self._waiting[pair]
            return None if state else self._turn_back(request)
        if request.method in EARLY_METHODS and self.guard.allows():
            self._waiting[pair] = _EARLY
            self._early.add(pair)
            self._stats.inc_value("ha/early_downloads")
            return None
        return self._wait(pair, request, None)

    def process_response(self, request: Request, response: Response) -> Any:
        """*response*, or a coroutine that gives it once its request is stored (*request*
        itself if it was not)."""
        return self._after(request, response)

    def process_exception(self, request: Request, exception: Exception) -> Any:
        """None (the error goes on to the other middlewares), at once or once its request
        is stored; *request* itself if it was not."""
        return self._after(request, None)

    def _after(self, request: Request, result: Response | None) -> Any:
        if not (self._early or self._refused):
            return result
        pair = _pair(request)
        if pair is None:
            return result
        if pair in self._refused:
            self._refused.discard(pair)
            return self._turn_back(request)
        if pair not in self._early:
            return result
        return self._wait(pair, request, result)

    def _wait(
        self, pair: Pair, request: Request, result: Response | None
    ) -> Coroutine[Any, Any, Request | Response | None]:
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting[pair] = future
        return self._await(request, future, result)

    async def _await(
        self, request: Request, verdict: asyncio.Future[bool], result: Response | None
    ) -> Request | Response | None:
        if await verdict:
            return result
        return await self._turn_back(request)

    async def _turn_back(self, request: Request) -> Request:
        self._dropping[id(request)] = request
        return request

    def dropped(self, request: Request) -> bool:
        """True (once) for a request the gate turned back, or a copy of an early download
        Redis refused (made by a middleware before its response came): the scheduler
        refuses it."""
        if self._refused and (pair := _pair(request)) in self._refused:
            self._refused.discard(pair)
            return True  # counted in dupefilter/filtered once, by its round
        return self._dropping.pop(id(request), None) is not None


def _pair(request: Request) -> Pair | None:
    lease = request.meta.get(metakeys.LEASE)
    return (str(lease[0]), str(lease[1])) if lease else None


class Handout:
    """The scheduler's side of the hand-out from memory: new requests wait in a
    :class:`FreshQueue` and go to the engine under a lease made here (:meth:`hand`); each
    round seals the ones it sends (:meth:`seal`) and settles those handed out by Redis's
    verdict (:meth:`settle`), which the :class:`DownloadGate` passes on to the download."""

    def __init__(
        self,
        crawler: Crawler,
        outbox: Outbox,
        inflight: InFlight,
        slots: _engine.SlotLoad,
        wake: Callable[[], None],
        *,
        queue: FreshQueue,
        early: bool = True,
    ) -> None:
        self.crawler = crawler
        self.queue = queue
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

    def push(self, fresh: Fresh) -> None:
        self.queue.push(fresh)
        self._pushed += 1

    def looked(self) -> None:
        """The engine called ``next_request()``: it was offered everything queued so far."""
        self._offered = self._pushed

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
        request.meta[metakeys.LEASE] = pair
        # It is its own page now, as a request leased from Redis is (the codec strips the
        # parent's lease): its redirects and retries are fenced by its lease, which it holds
        # until it is finished, not by the parent's, which may be acked before it downloads.
        request.meta.pop(metakeys.PARENT, None)
        self.unstored.add(pair)
        self.gate.expect(pair)
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
            if not _engine.has_room(self.crawler):
                return
            await _engine.look(self.crawler)

    def seal(self, batch: list[NewEntry], *, keep: bool = True) -> int:
        """*batch* goes to Redis now: its new requests not handed out leave the queue (they
        go pending, and come back by lease, or with *keep* are kept if they may be:
        :mod:`scrapy_ha._keep`); return how many are kept."""
        keeper = self.queue.keep if keep else None
        kept = keeper.choose(batch, self._make_lease) if keeper is not None else 0
        for entry in batch:
            fresh = entry.fresh
            if fresh is not None and not fresh.sealed:
                fresh.sealed = True
                if fresh.lease is None:
                    self._outbox.note_priority(entry.priority)
        self.queue.prune()
        return kept

    def settle(self, batch: list[NewEntry], dropped: set[str]) -> None:
        """Redis has *batch*: a request handed out from it was stored leased to this worker
        (its download goes on), or not (*dropped*: a duplicate, or its page's lease was
        lost): then it is cancelled and forgotten, never acked."""
        leased = handed = kept = 0
        for entry in batch:
            pair = entry.taken
            if pair is None:
                continue
            stored = pair[0] not in dropped
            if entry.kept:
                assert self.queue.keep is not None and entry.fresh is not None
                self.queue.keep.landed(entry.fresh, stored=stored)
                kept += stored
                continue
            handed += 1  # counted here, once per round, not at each hand-out (hot path)
            self.unstored.discard(pair)
            if stored:  # stored marked as handed: no early report is needed
                leased += 1
            else:
                self._inflight.discard(pair[0])
            self.gate.settle(pair, stored=stored)
        self.gate.guard.note(handed, leased)
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
