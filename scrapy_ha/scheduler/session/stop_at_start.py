"""A worker stopped while it opens (Ctrl-C, SIGTERM, scrapyd's cancel) closes the crawl
before it exits, as one stopped while it crawls does: stopped before its start at Redis
was done it logs one ERROR naming the Redis (password masked), closes as
``ha_start_failed`` and ``scrapy crawl`` exits with 1; stopped once the scheduler had
opened but before the engine ran (a slow ``spider_opened`` handler or pipeline), the
spider is closed as ``shutdown`` and hands back what it registered in Redis.

Why: Scrapy stops its reactor at once when the engine is not running yet
(``Crawler.stop_async`` has nothing to stop), abandoning the crawl where it was: a worker
stopped in its start wait logged nothing after "Received SIGINT" and exited with 0, as if
it had crawled; without a reactor (``TWISTED_REACTOR_ENABLED = False``) the stop was not
seen at all. So from the scheduler's open until the engine runs (:class:`StopAtStart`):

- every stop of the crawler (``Crawler.stop_async``, with or without a reactor) cuts the
  start short (:class:`~scrapy_ha.store.start_wait.StartWait`: a wait at once, a step on
  a Redis that answered after its grace), and the close that follows waits for Redis
  :data:`STOPPED_CLOSE_TIMEOUT` seconds at most;
- a "before shutdown" trigger of the reactor holds its shutdown until the crawl has closed
  (the engine's close has ended in its task, and the crawl's task too, and the engine's
  start if one began: Scrapy 2.16's Deferred-based ``CrawlerProcess`` starts the engine
  after an open a stop cut short, and counts the crawl only once that start returned), which
  is what makes Scrapy count it: with ``AsyncCrawlerProcess`` and with the Deferred-based
  ``CrawlerProcess`` (``FORCE_CRAWLER_PROCESS``) alike. The hold ends after
  :data:`STOP_CLOSE_TIMEOUT` seconds, or at once on a second Ctrl-C or SIGTERM; then an
  ERROR says the crawl did not close, ``scrapy crawl`` exits with 1 (with
  ``AsyncCrawlerProcess``, its default), and what it wrote in Redis is left as a killed
  worker leaves it (its heartbeat expires, its leases are reclaimed);
- a stop that came before the engine runs stops the engine as it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from typing import TYPE_CHECKING, Any

from scrapy import signals
from twisted.internet.defer import Deferred

from scrapy_ha.scheduler import engine
from scrapy_ha.store.start_wait import Halt, StoppedAtStart

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy.crawler import Crawler

    from scrapy_ha.scheduler.session.closing import CloseClock

__all__ = ["STOPPED_CLOSE_TIMEOUT", "STOP_CLOSE_TIMEOUT", "StopAtStart"]

logger = logging.getLogger(__name__)

#: Seconds the reactor's shutdown waits for a crawl stopped at start to close: its steps
#: get STOP_STEP_GRACE (2 s), its close STOPPED_CLOSE_TIMEOUT and 1 s of teardown, which
#: leaves room on a loaded machine; past it the crawl is left as a killed worker's.
STOP_CLOSE_TIMEOUT = 10.0
#: Seconds the close of a crawl stopped at start waits for Redis (``HA_CLOSE_TIMEOUT``
#: when lower): nothing was leased yet, and a Redis that answers takes milliseconds.
STOPPED_CLOSE_TIMEOUT = 3.0
#: Seconds the shutdown waits, once the hold gave up, for the crawl's tasks to end
#: cancelled (what makes Scrapy count the crawl as failed).
ABANDON_WAIT = 1.0
#: The coroutine of a crawl's task in Scrapy's ``AsyncCrawlerProcess`` (2.14 and later):
#: cancelled, it counts the crawl as failed if the crawler has no spider, and logs nothing.
ASYNC_CRAWL = "_crawl_and_track"
#: The signals whose second coming ends the hold (Scrapy's "forcing unclean shutdown").
SECOND_STOP = (signal.SIGINT, signal.SIGTERM)


class StopAtStart(Halt):
    """A :class:`~scrapy_ha.store.start_wait.Halt` every stop of *crawler* sets while the
    scheduler opens (:meth:`watching`); *clock*: the close's, hurried by a stop. Make it
    in the crawl's task (Scrapy builds the scheduler there, in ``open_spider``)."""

    def __init__(self, crawler: Crawler, clock: CloseClock) -> None:
        super().__init__()
        self.crawler, self.clock = crawler, clock
        try:
            self.crawl: asyncio.Task[Any] | None = asyncio.current_task()
        except RuntimeError:  # built outside an event loop (a test): nothing to wait for
            self.crawl = None
        self.redis_url = ""
        self._trigger: Any = None  # the reactor's "before shutdown" trigger, until it fired
        self._fired = False
        self._closing_task: asyncio.Task[Any] | None = None
        self._closed = False  # the engine's close has ended (in its task)
        self._hold: Deferred[None] | None = None
        self._expiry: Any = None
        self._handlers: dict[int, tuple[Any, Any]] = {}  # signal -> (ours, the one before)
        self._stop_watch: tuple[Any, Any] | None = None  # (ours, the crawler's own, if any)
        self._start_watch: tuple[Any, Any, Any] | None = None  # (engine, ours, its own if any)
        self._starting = False  # the engine's start was called (a task may not run it yet)
        self._start: asyncio.Task[Any] | None = None  # the task that runs it, once it runs
        # a scheduler closed before its engine ran (Scrapy's scheduler tests, a tool that
        # drives one) ends the watch too: else the reactor's shutdown, at the process's
        # exit, waited 10 s for a close long done
        clock.at_hand_back.append(self._closed_unstopped)

    def stop(self) -> None:
        if not self.stopped:
            self.clock.hurry(STOPPED_CLOSE_TIMEOUT)
        super().stop()

    @contextlib.contextmanager
    def watching(self, redis_url: str) -> Iterator[None]:
        """While the scheduler opens, a stop cuts its start short; an open that a stop came
        during and that went on all the same is refused when it ends
        (:class:`StoppedAtStart`). A stop from then until the engine runs (a slow
        ``spider_opened`` handler) stops the engine as it starts: the crawler's stop stays
        watched until then (before, only during the open: Scrapy 2.16's stopped the
        crawler while the engine did not run yet and the reactor a moment later, after
        the engine had started, and the worker exited without closing the spider)."""
        self.redis_url = redis_url
        self._hook()
        self._watch_stop()
        yield
        if self.stopped:
            raise StoppedAtStart(
                f"stopped while it opened the crawl at Redis at {redis_url}: the crawl did not "
                "start"
            )

    def _watch_stop(self) -> None:
        """Every stop of the crawler (``Crawler.stop_async``) stops this too, until
        :meth:`_end_watch`."""
        crawler = self.crawler
        if self._stop_watch is not None:
            return
        before, stop_async = vars(crawler).get("stop_async"), crawler.stop_async

        async def stopping() -> None:
            self.stop()
            await stop_async()

        crawler.stop_async = stopping  # type: ignore[method-assign]
        self._stop_watch = (stopping, before)
        self._watch_start()

    def _watch_start(self) -> None:
        """Note when the engine's start is called, and the task it runs in: Scrapy 2.16's
        Deferred-based ``Crawler.crawl`` starts the engine after an open that a stop cut
        short, and counts the crawl (``bootstrap_failed``) only once that start returned,
        in the task's first done callback; ours, added later, ends the shutdown's hold
        after it (before, the hold ended first: the reactor stopped before Scrapy counted
        the crawl, and ``scrapy crawl`` exited with 0)."""
        running = engine.current(self.crawler)  # (Scrapy 2.19 raises before it is set)
        if running is None or self._start_watch is not None:
            return
        before, start_async = vars(running).get("start_async"), running.start_async

        def starting(*args: Any, **kwargs: Any) -> Any:
            self._starting = True  # (before its task runs: the hold must wait for it)
            return self._started(start_async(*args, **kwargs))

        running.start_async = starting  # type: ignore[method-assign]
        self._start_watch = (running, starting, before)

    async def _started(self, start: Any) -> None:
        self._start = asyncio.current_task()
        if self._start is not None:
            self._start.add_done_callback(self._release_if_over)
        await start

    def _unwatch_stop(self) -> None:
        watch, self._stop_watch = self._stop_watch, None
        if watch is not None and vars(self.crawler).get("stop_async") is watch[0]:
            if watch[1] is None:  # (not replaced since: else left alone)
                del self.crawler.stop_async
            else:
                self.crawler.stop_async = watch[1]  # type: ignore[method-assign]
        started, self._start_watch = self._start_watch, None
        if started is not None and vars(started[0]).get("start_async") is started[1]:
            if started[2] is None:
                del started[0].start_async
            else:
                started[0].start_async = started[2]

    def _hook(self) -> None:
        if self._trigger is not None or self._fired:
            return
        # never imported here: with TWISTED_REACTOR_ENABLED=False there is none, and the
        # import would install one
        reactor: Any = sys.modules.get("twisted.internet.reactor")
        if reactor is not None:
            self._trigger = reactor.addSystemEventTrigger("before", "shutdown", self._shutting_down)
        # (the close is watched from the open: a start that fails closes the spider before
        # the reactor's shutdown, whose hold then sees it closed)
        engine.on_closing(self.crawler, self._closing)
        self.crawler.signals.connect(self._engine_started, signal=signals.engine_started)

    async def _engine_started(self) -> None:
        """From now on Scrapy's own stop stops the engine; a stop that came while the spider
        opened stops it now (as it starts), which closes the spider; the reactor's
        shutdown then waits for that close (Scrapy 2.16 stops the reactor after the
        crawler, which it stopped while the engine did not run: the close was cut short)."""
        # (a stop of the crawler sets it: its stop_async is watched from the open on; not
        # ``crawler.crawling``, False for an engine started without Crawler.crawl)
        if not self.stopped:
            self._end_watch()
        else:
            self._unwatch_stop()  # (the trigger stays until the close ends: _on_closed)
            self.crawler.signals.disconnect(self._engine_started, signal=signals.engine_started)
            running = self.crawler.engine
            if running is not None:
                await running.stop_async()

    def _closed_unstopped(self) -> None:
        """The scheduler closes: no stop came (else the shutdown's hold waits for this
        close, and the trigger stays for it), so nothing is left to watch."""
        if not self.stopped:
            self._end_watch()

    def _end_watch(self) -> None:
        """Remove the reactor's trigger, unless it fired (removing one that fired is
        deprecated in Twisted, and the shutdown under way needs it), and stop watching the
        crawler's stop."""
        self._unwatch_stop()
        self.crawler.signals.disconnect(self._engine_started, signal=signals.engine_started)
        trigger, self._trigger = self._trigger, None
        if trigger is not None and not self._fired:
            sys.modules["twisted.internet.reactor"].removeSystemEventTrigger(trigger)

    def _closing(self) -> None:
        """The engine began to close the spider: the task it runs in ends once it closed
        (and, with the Deferred-based ``CrawlerProcess``, once Scrapy counted the crawl)."""
        if self._closing_task is not None or self._closed:
            return
        self._closing_task = asyncio.current_task()
        if self._closing_task is None:
            self._on_closed()
        else:
            self._closing_task.add_done_callback(self._on_closed)

    def _on_closed(self, *_: object) -> None:
        self._closed = True
        self._end_watch()
        self._release_if_over()

    def _over(self) -> bool:
        started = not self._starting or (self._start is not None and self._start.done())
        return self._closed and started and (self.crawl is None or self.crawl.done())

    def _shutting_down(self) -> Deferred[None] | None:
        """The reactor shuts down (Scrapy's first Ctrl-C or SIGTERM, or a stop from
        elsewhere): stop the start, and hold the shutdown until the crawl has closed."""
        self._fired = True
        self.stop()
        if self.crawl is None or self._over():
            return None
        self._hold = Deferred()
        if not self.crawl.done():
            self.crawl.add_done_callback(self._release_if_over)
        reactor: Any = sys.modules["twisted.internet.reactor"]
        within = f"within {STOP_CLOSE_TIMEOUT:g} s of the stop"
        self._expiry = reactor.callLater(STOP_CLOSE_TIMEOUT, self._give_up, within)
        self._second_stop(reactor)
        return self._hold

    def _second_stop(self, reactor: Any) -> None:
        """A second Ctrl-C or SIGTERM ends the hold at once (Scrapy's own handler, run as
        well, cannot: the reactor is already stopping)."""
        for sig in SECOND_STOP:
            before = signal.getsignal(sig)
            if before is None:  # (a handler set from outside Python: left alone)
                continue

            def again(signum: int, frame: Any, before: Any = before) -> None:
                reactor.callFromThread(self._give_up, "before a second stop came")
                if callable(before):
                    before(signum, frame)

            with contextlib.suppress(ValueError):  # not the main thread: no signals here
                signal.signal(sig, again)
                self._handlers[sig] = (again, before)

    def _give_up(self, when: str) -> None:
        if self._hold is None or self._hold.called:
            return
        logger.error(
            "scrapy-ha was stopped at start and the crawl at Redis at %s did not close %s: "
            "Scrapy stops without it; what this worker wrote there is left as a killed "
            "worker leaves it (its heartbeat expires, other workers reclaim its leases)",
            self.redis_url,
            when,
        )
        self._abandon()

    def _abandon(self) -> None:
        """Have Scrapy count the crawl given up on as failed (``scrapy crawl`` exits with 1;
        before, 0, as after a crawl): it has no spider, and its task ends cancelled; the
        hold ends once it ended (Scrapy's own callback on it runs first), within
        :data:`ABANDON_WAIT`. Only the task of ``AsyncCrawlerProcess``, Scrapy's default:
        under the Deferred-based ``CrawlerProcess`` the task is the engine's open, whose
        Deferreds log a cancellation as an unhandled error (CRITICAL, two tracebacks)."""
        crawl = self.crawl
        if crawl is None or crawl.done() or _coroutine_name(crawl) != ASYNC_CRAWL:
            self._release()
            return
        self.crawler.spider = None
        crawl.add_done_callback(lambda _: self._release())
        crawl.cancel()
        if self._expiry is not None and self._expiry.active():
            self._expiry.cancel()
        reactor: Any = sys.modules["twisted.internet.reactor"]
        self._expiry = reactor.callLater(ABANDON_WAIT, self._release)

    def _release_if_over(self, *_: object) -> None:
        if self._over():
            self._release()

    def _release(self) -> None:
        if self._expiry is not None and self._expiry.active():
            self._expiry.cancel()
        for sig, (ours, before) in self._handlers.items():
            if signal.getsignal(sig) is ours:  # (Scrapy's second stop replaced it)
                signal.signal(sig, before)
        self._handlers.clear()
        if self._hold is not None and not self._hold.called:
            self._hold.callback(None)


def _coroutine_name(task: asyncio.Task[Any]) -> str:
    return getattr(task.get_coro(), "__name__", "")
