"""Every fact scrapy-ha relies on about Scrapy's engine internals, in one package (the
download slots' load in :mod:`.slots`).

Scrapy has no public API for "is this request finished?", "how busy is this download
slot?" or "look at the scheduler again now"; the scheduler needs all three. Each function
here reads private engine state: each names the Scrapy versions it was checked on (2.16 and
2.19.0, the version in constraints.txt), so that an upgrade of Scrapy has one package to
re-check. No module of scrapy-ha outside it reads the engine's private attributes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

from scrapy import signals

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.core.engine import ExecutionEngine
    from scrapy.crawler import Crawler
    from scrapy.http import Response


def _engine(crawler: Crawler) -> ExecutionEngine | None:
    """``crawler.engine``, or None before the crawl starts: Scrapy 2.19 raises
    RuntimeError when it is read before it is set (a "late attribute"), 2.16 returns None.
    Read a few times per page, so on 2.19 from where the late attribute keeps it,
    ``crawler._engine`` (set by ``crawler.engine = ...`` too), without the descriptor's
    call; anything else (2.16, a stand-in crawler) reads ``crawler.engine``."""
    engine: ExecutionEngine | None = getattr(crawler, "_engine", None)
    if engine is not None:
        return engine
    try:
        return crawler.engine
    except RuntimeError:
        return None


def current(crawler: Crawler) -> ExecutionEngine | None:
    """The crawler's engine, or None before the crawl starts (Scrapy 2.19 raises when
    ``crawler.engine`` is read then)."""
    return _engine(crawler)


def wake(crawler: Crawler) -> None:
    """Make the engine call ``next_request`` soon: ``engine._slot.nextcall.schedule()``
    (``_slot`` is None before the spider opens and after it closes; 2.16, 2.19); nothing
    without an engine."""
    slot = getattr(_engine(crawler), "_slot", None)
    if slot is not None:
        slot.nextcall.schedule()


def gate_downloads(crawler: Crawler, gate: Gate) -> bool:
    """Put *gate*'s ``process_request`` first in the downloader middleware chain, and, if it
    ``holds_results``, its ``process_response`` and ``process_exception`` nearest the
    downloader (called before every other middleware's); False if there is no chain (no
    engine, or a stand-in engine with no downloader middlewares, which downloads nothing).

    ``engine.downloader.middleware.methods`` maps each name to the deque of the
    middlewares' methods in the order ``download_async`` calls them, with keyword arguments
    only (methods not in ``_mw_methods_requiring_spider``): ``process_request`` in the
    middlewares' order, the other two in the reverse order (``_add_middleware`` appends
    them on the left). A coroutine a method returns is awaited; a Request given back ends
    the chain and goes to ``engine.crawl`` instead (2.16, 2.19).
    """
    middleware = getattr(getattr(_engine(crawler), "downloader", None), "middleware", None)
    methods = getattr(middleware, "methods", None)
    if not isinstance(methods, dict) or "process_request" not in methods:
        return False
    names = ["process_request"]
    if gate.holds_results:  # else its other two return their input: two calls per page saved
        names += ["process_response", "process_exception"]
    for name in names:
        chain = methods.setdefault(name, deque())  # absent while no middleware has one
        method = getattr(gate, name)
        if method not in chain:
            chain.appendleft(method)
    return True


class Gate(Protocol):
    """What :func:`gate_downloads` installs (:class:`scrapy_ha.scheduler.gate.DownloadGate`);
    its ``process_response`` and ``process_exception`` only if it ``holds_results``."""

    @property
    def holds_results(self) -> bool: ...

    def process_request(self, request: Request) -> Any: ...

    def process_response(self, request: Request, response: Response) -> Any: ...

    def process_exception(self, request: Request, exception: Exception) -> Any: ...


def busy_check(crawler: Crawler) -> Callable[[Request], bool]:
    """A test: is this request still somewhere in the engine?

    A request is finished when it is in none of ``downloader.active``,
    ``scraper.slot.active``, ``scraper.slot.queue`` (a list of (result, request, deferred)
    triples, not yet in ``active``) and ``engine._slot.inprogress``; the engine updates
    them synchronously (2.16, 2.19). ``scraper.slot`` is None while no spider is open.
    Without an engine, or with a stand-in without a downloader's ``active`` set (Scrapy's
    scheduler tests), nothing is finished.
    """
    engine = _engine(crawler)
    active = getattr(getattr(engine, "downloader", None), "active", None)
    if engine is None or not isinstance(active, set):  # no engine, or a stand-in
        return lambda r: True  # nothing it holds is known to be finished: released at close
    queued: set[int] = set()
    scraping: set[Request] = set()
    slot = engine.scraper.slot
    if slot is not None:
        scraping = slot.active
        queued = {id(r) for _, r, _ in slot.queue}
    engine_slot = getattr(engine, "_slot", None)
    starting: set[Request] = set() if engine_slot is None else engine_slot.inprogress
    # the sets named one by one, no generator: asked of every request held, a few times a page
    return lambda r: r in active or r in scraping or r in starting or id(r) in queued


def started_first(crawler: Crawler) -> bool:
    """Whether *crawler*'s engine started before its spider opened: only ``scrapy shell``
    does so (``start_async(_start_request_processing=False)``, then ``open_spider_async``
    at its first fetch), where ``Crawler.crawl`` opens the spider first (checked on 2.19.0:
    ``_starting``, set as the engine starts)."""
    engine = _engine(crawler)
    return engine is not None and getattr(engine, "_starting", False) is True


def start_exhausted(crawler: Crawler) -> bool:
    """True once the engine has read all of ``Spider.start()`` (or stopped reading it on an
    error): ``engine._start`` is set before the scheduler opens and becomes None at the
    end (2.16, 2.19); False without an engine."""
    engine = _engine(crawler)
    return engine is not None and getattr(engine, "_start", None) is None


def on_closing(crawler: Crawler, callback: Callable[[], None]) -> bool:
    """Call *callback* each time the engine starts closing the spider, before it waits for
    the requests in progress; False without an engine.

    Scrapy sends no signal there (``spider_closed`` comes once they are all done), and
    every close goes through ``engine.close_spider_async`` (a stop, an idle spider,
    ``CloseSpider``; checked on 2.19.0): the engine's attribute is wrapped, the class is
    untouched."""
    engine = _engine(crawler)
    close = getattr(engine, "close_spider_async", None)
    if engine is None or close is None:
        return False

    async def closing(*args: Any, **kwargs: Any) -> None:
        callback()
        await close(*args, **kwargs)

    engine.close_spider_async = closing  # type: ignore[method-assign]
    return True


def close_spider(crawler: Crawler, reason: str) -> None:
    """Close the running spider with *reason* (nothing if the engine is gone)."""
    engine = _engine(crawler)
    if engine is not None:
        asyncio.ensure_future(engine.close_spider_async(reason=reason))


def has_room(crawler: Crawler) -> bool:
    """Would the engine call ``next_request()`` if it looked now? ``engine.needs_backout()``
    (public since 2.13, the lazy start pattern of Scrapy's docs; 2.16, 2.19) is False; False
    without an engine or with a stand-in without it."""
    engine = _engine(crawler)
    needs_backout = getattr(engine, "needs_backout", None)
    if not callable(needs_backout) or getattr(engine, "_slot", None) is None:
        return False
    return not needs_backout()


#: Seconds :func:`look` waits for the engine at most: it looks within a turn or two of the
#: event loop, unless its slot is closing (then it never looks again).
LOOK_TIMEOUT = 1.0


async def look(crawler: Crawler) -> None:
    """Make the engine look at the scheduler now and return once it has:
    ``engine._slot.nextcall`` is a ``CallLaterOnce`` whose ``wait()`` returns after its next
    run (2.16, 2.19, where the engine itself awaits it between start requests); one turn of
    the event loop where it has no ``wait()``."""
    slot = getattr(_engine(crawler), "_slot", None)
    if slot is None:
        return
    slot.nextcall.schedule()
    wait = getattr(slot.nextcall, "wait", None)
    if wait is None:
        await asyncio.sleep(0)
        return
    # a nextcall cancelled by the slot closing never runs again, and never returns from wait()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(LOOK_TIMEOUT):
            await wait()


class _QuietEmptySignals:
    """``crawler.signals`` as the engine sees it, but ``scheduler_empty`` is not sent while
    *busy()* says requests are on their way to the scheduler (see :func:`quiet_empty`)."""

    def __init__(self, signals_: Any, busy: Callable[[], bool]) -> None:
        self._signals = signals_
        self._busy = busy

    def send_catch_log(self, signal: object, **kwargs: Any) -> Any:
        if signal is signals.scheduler_empty and self._busy():
            return []
        return self._signals.send_catch_log(signal, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._signals, name)


def quiet_empty(crawler: Crawler, busy: Callable[[], bool]) -> bool:
    """Hold back ``scheduler_empty`` while *busy()* is true; False without an engine.

    The engine sends it from ``_start_scheduled_request`` through ``engine.signals`` (the
    crawler's ``SignalManager``, set in ``__init__``) whenever ``next_request()`` returns None
    (2.16, 2.19), with no other condition: Scrapy's own scheduler returns None only when it
    holds nothing. ``engine.signals`` is wrapped, so the crawler's own ``signals`` (what
    handlers connect to) is untouched."""
    engine = _engine(crawler)
    current = getattr(engine, "signals", None)
    if engine is None or current is None:
        return False
    if not isinstance(current, _QuietEmptySignals):
        engine.signals = _QuietEmptySignals(current, busy)  # type: ignore[assignment]
    return True
