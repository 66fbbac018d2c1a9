"""How busy Scrapy's download slots are, counting what this worker handed out: what the
scheduler hands out (or keeps buffered for other workers) depends on it. Like the rest of
:mod:`scrapy_ha.scheduler.engine`, it reads private engine state, and names the Scrapy
versions it was checked on."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from scrapy.core.downloader import Downloader

from scrapy_ha import metakeys
from scrapy_ha.codec import header_names
from scrapy_ha.scheduler.engine import _engine

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.crawler import Crawler

#: Hand-outs between two sweeps of :class:`SlotLoad` for slots no longer asked about, at
#: least (and at least as many as the last sweep kept, so that a sweep costs under two
#: checks per hand-out): a finished request such a slot holds is kept alive until then,
#: a dozen objects more for each pass of the garbage collector (it was 1,000 hand-outs).
SLOT_SWEEP_EVERY = 200


class SlotLoad:
    """How busy each download slot is, counting what this worker handed out.

    ``downloader.slots`` maps ``downloader.get_slot_key(request)`` to a slot whose ``active``
    set holds the requests it runs or queues and whose ``concurrency`` is its limit (0: none);
    an absent slot is a new one, whose limit is its ``DOWNLOAD_SLOTS`` concurrency
    (``downloader.per_slot_settings``), else ``ip_concurrency``, else ``domain_concurrency``.
    A request enters ``slot.active`` once the downloader middlewares ran, a turn of the
    event loop or more after the engine took it, while ``downloader.active`` holds it from
    then on (``_download`` calls ``downloader.fetch`` synchronously; 2.16, 2.19). So a
    slot's load is its ``active`` set plus what this worker handed to it that is still in
    ``downloader.active``, keyed to the slot, and not in it yet. One that reached it is
    forgotten: it leaves ``slot.active`` before ``downloader.active`` (its response goes
    back through the middlewares; 2.19) and holds no place then. O(requests on their way).
    """

    def __init__(self) -> None:
        self._handed: dict[str, list[Request]] = {}
        self._since_sweep = 0
        self._swept = 0  # requests the last sweep kept (still in the downloader)
        #: the request :meth:`free` looked at last and its slot key: the one handed out
        #: next, in the same call of the engine (a slot key costs a parse of the host); one
        #: checked and not handed out stays referenced here until the next check
        self._asked: tuple[Request | None, str] = (None, "")
        #: the request handed out in this call of ``next_request()``: the engine adds it to
        #: ``downloader.active`` only once the call has returned it, so a count made before
        #: (the scheduler weighs the slots as it hands out) must not take it for finished.
        #: Before, such a count forgot each request of a host as it was handed out, and a
        #: host answering 429 at once got 17 requests in a millisecond, two allowed at once
        #: (a QA run). Forgotten at the engine's next call (:meth:`taken`)
        self._last: Request | None = None

    def free(self, crawler: Crawler, request: Request) -> bool:
        """Can the downloader start *request* now? True without an engine."""
        downloader = getattr(_engine(crawler), "downloader", None)
        if downloader is None:
            return True
        key = downloader.get_slot_key(request)
        self._asked = (request, key)
        slot = downloader.slots.get(key)
        if slot is None:  # as the downloader will make it (DOWNLOAD_SLOTS may set its own)
            default = getattr(downloader, "ip_concurrency", 0) or getattr(
                downloader, "domain_concurrency", 0
            )
            per_slot = getattr(downloader, "per_slot_settings", {})
            limit = per_slot.get(key, {}).get("concurrency", default)
            running: Any = ()
        else:  # a stand-in downloader (Scrapy's scheduler tests) may have no limits
            limit, running = getattr(slot, "concurrency", 0), slot.active
        if limit <= 0:
            return True
        handed = self._handed.get(key)
        if handed:
            # in the slot now or gone from the downloader: no longer on its way (one that
            # reached the slot out of order is dropped here, while the slot holds it: once
            # it left the slot, its response back in the middlewares, it would look on its
            # way again). Moved to another slot by a downloader middleware
            # (``meta["download_slot"]``, e.g. one slot per proxy): looked up only when the
            # slot would be full with all of them counted (a slot key per request is dear).
            active = downloader.active
            last = self._last
            handed[:] = [r for r in handed if r not in running and (r is last or r in active)]
            if len(running) + len(handed) >= limit:
                keyed = _keyed_to(downloader, key)
                handed[:] = [r for r in handed if keyed(r)]
        return bool(len(running) + len(handed or ()) < limit)

    def load(self, crawler: Crawler, key: str) -> int:
        """Requests download slot *key* runs or queues, plus those this worker handed to it
        that are not in it yet (as in :meth:`free`); 0 without an engine."""
        downloader = getattr(_engine(crawler), "downloader", None)
        if downloader is None:
            return 0
        slot = downloader.slots.get(key)
        running: Any = () if slot is None else slot.active
        active = getattr(downloader, "active", ())
        handed = self._handed.get(key)
        if handed:  # forgotten once in the slot or gone, as in free()
            last = self._last
            handed[:] = [r for r in handed if r not in running and (r is last or r in active)]
        return len(running) + len(handed or ())

    def unsent(self, crawler: Crawler, request: Request) -> bool:
        """Does *request*'s download slot, one with a delay (``DOWNLOAD_DELAY``,
        AutoThrottle's), hold a request it has not sent yet (queued behind the delay,
        ``slot.queue``), or one this worker handed to it that is not in it yet (as in
        :meth:`free`)? False without an engine, and for a slot without a delay (it sends
        what it has room for at once: :meth:`free` says when it has none)."""
        downloader = getattr(_engine(crawler), "downloader", None)
        if downloader is None:
            return False
        key = downloader.get_slot_key(request)
        slot = downloader.slots.get(key)
        if slot is None or not getattr(slot, "delay", 0):
            return False
        return bool(slot.queue) or self.load(crawler, key) > len(slot.active)

    def handed(self, crawler: Crawler, request: Request) -> None:
        """*request* goes to the engine now (when, and with which headers of its own: its
        ``meta["_ha_handed"]`` and ``meta["_ha_own_headers"]``)."""
        meta = request.meta
        meta[metakeys.HANDED] = time.monotonic()
        meta[metakeys.OWN_HEADERS] = header_names(request)
        downloader = getattr(_engine(crawler), "downloader", None)
        if downloader is None:
            return
        self._since_sweep += 1
        if self._since_sweep >= max(SLOT_SWEEP_EVERY, self._swept):
            # before *request* is counted: it reaches the downloader's active set only
            # after this call, and a sweep must not take it for finished
            self._since_sweep = 0  # slots no longer asked about keep nothing finished
            active = downloader.active
            for key, handed in list(self._handed.items()):
                handed[:] = [r for r in handed if r is self._last or r in active]
                if not handed:
                    del self._handed[key]
            self._swept = sum(map(len, self._handed.values()))
        asked, key = self._asked
        self._asked = (None, "")  # a check serves one hand-out only
        if asked is not request:
            key = downloader.get_slot_key(request)
        self._handed.setdefault(key, []).append(request)
        self._last = request

    def taken(self) -> None:
        """The engine calls ``next_request()`` again: it has the request handed out last."""
        self._last = None


def _keyed_to(downloader: Any, key: str) -> Callable[[Request], bool]:
    """A test: is a request handed out for slot *key* keyed to it still? Scrapy's
    ``get_slot_key`` is ``meta["download_slot"]`` when set (by a middleware, or by the
    downloader as it queues the request), else the URL's host, which never changes, or with
    per-IP slots the host's resolved address (2.16, 2.19). So without per-IP slots the meta
    alone tells (no host parsed again per request on its way at every hand-out: ten a page
    in a crawl of one site); with them, or an own ``get_slot_key``, the downloader tells."""
    own = "get_slot_key" in vars(downloader) or (
        getattr(type(downloader), "get_slot_key", None) is not Downloader.get_slot_key
    )
    if own or downloader.ip_concurrency:  # a stand-in is "own": never read here
        slot_key = downloader.get_slot_key
        return lambda r: bool(slot_key(r) == key)
    meta_key = Downloader.DOWNLOAD_SLOT
    return lambda r: bool(r.meta.get(meta_key, key) == key)


def capacity(crawler: Crawler, enough: int) -> int:
    """Requests the downloader can run at once: each download slot's ``concurrency``, plus a
    new slot's (``ip_concurrency`` when CONCURRENT_REQUESTS_PER_IP is set, else
    ``domain_concurrency``; 2.16, 2.19); counting stops at *enough* (this runs on every
    hand-out, and a broad crawl has thousands of slots). *enough* without an engine."""
    downloader = getattr(_engine(crawler), "downloader", None)
    if downloader is None:
        return enough
    total: int = downloader.ip_concurrency or downloader.domain_concurrency
    for slot in downloader.slots.values():
        if total >= enough:
            break
        total += slot.concurrency
    return total
