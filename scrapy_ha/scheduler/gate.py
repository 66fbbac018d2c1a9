"""The gate between a request handed out before Redis had it and what comes of it.

A worker hands its own new requests to its engine before the round that stores them
(:mod:`scrapy_ha.scheduler.fresh`); only that round knows whether Redis took each one (a duplicate
another worker or an earlier run had, a child of a lease this worker lost, is refused).
:class:`DownloadGate` holds what comes of such a request until the round's verdict: it goes
on if the request was stored, and is turned back if not (the engine schedules it again and
the scheduler refuses it, as Scrapy drops a duplicate: ``request_dropped``, no callback, no
errback). Its download waits for the verdict, unless ``HA_EARLY_DOWNLOAD`` lets a GET or HEAD
download meanwhile while :class:`EarlyGuard` allows it: then its response or error waits,
nearest the downloader, before any other downloader middleware sees it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from scrapy_ha import metakeys

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine
    from typing import Any

    from scrapy import Request
    from scrapy.http import Response
    from scrapy.statscollectors import StatsCollector

    from scrapy_ha.scheduler.outbox import Pair

#: Methods whose download may start before the round's verdict: safe methods (RFC 9110),
#: so one that Redis then refuses costs the site a response it did not need to serve and
#: the worker a download, never a callback.
EARLY_METHODS = frozenset({"GET", "HEAD"})
#: New requests the early-download guard looks back over: half of it before it opens, at
#: most the whole (a count that halves as it grows past it).
EARLY_WINDOW = 200
#: The share of those Redis may have refused (duplicates, fenced children) for downloads
#: to start before the verdict.
EARLY_MAX_REFUSED = 0.01


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

    def redone(self, entry_id: str) -> bool:
        """Whether *entry_id*, a lease this worker holds, had expired before it took it
        (asked while it is held: once it is not, :meth:`allows` forgets it)."""
        return entry_id in self._redoing

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
#: A fresh request that downloads only once it is stored: a link of a page this worker
#: redoes (see DownloadGate.expect).
_LATE = "late"


class DownloadGate:
    """Holds what comes of a request handed out before Redis had it until the round that
    stores it says whether it was stored (see the module docstring).

    Installed at both ends of the downloader middleware chain
    (:func:`scrapy_ha.scheduler.engine.gate_downloads`): :meth:`process_request` first, which lets
    a GET or HEAD go on (the :class:`EarlyGuard` permitting) and holds any other request
    until its verdict; :meth:`process_response` and :meth:`process_exception` nearest the
    downloader, which hold a response or an error until its verdict. Each returns None or
    its input at once for any request it does not wait for.
    """

    def __init__(self, stats: StatsCollector, *, early: bool = True) -> None:
        self.installed = False
        self.guard = EarlyGuard(early)
        self._stats = stats
        #: handed out, verdict not known: None or _LATE (not at the gate yet), _EARLY
        #: (downloading), a future the gate awaits; or the verdict, until process_request
        #: takes it
        self._waiting: dict[Pair, asyncio.Future[bool] | bool | str | None] = {}
        #: those whose download started before their verdict, until it comes
        self._early: set[Pair] = set()
        #: early downloads Redis refused, until their response, their error or a copy of
        #: their request (a middleware's, e.g. a proxy's wait) comes back: turned back
        self._refused: set[Pair] = set()
        self._dropping: dict[int, Request] = {}

    @property
    def holds_results(self) -> bool:
        """Whether a response or an error may have to wait for its verdict: only that of a
        download started early (``HA_EARLY_DOWNLOAD``). Without early downloads
        :meth:`process_response` and :meth:`process_exception` give back their input, and
        are not installed (each a middleware call of Scrapy's per page)."""
        return self.guard.enabled

    def expect(self, pair: Pair, *, late: bool = False) -> None:
        """*pair* was handed out before Redis had it. A *late* one, a link of a page this
        worker redoes, never downloads before its verdict, even once that page is done (the
        engine takes a page's links as it has room, often after): it is likely in Redis
        already, held by the worker that died, and would be downloaded once more by the
        redo of that worker's lease."""
        if self.installed:
            self._waiting[pair] = _LATE if late else None

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
        if request.method in EARLY_METHODS and state != _LATE and self.guard.allows():
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
