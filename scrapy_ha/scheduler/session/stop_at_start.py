"""A worker stopped while it opens (Ctrl-C, SIGTERM, scrapyd's cancel) ends as a crawl that
could not start: one ERROR line naming the Redis it never reached (or the open it left),
the finish reason ``ha_start_failed``, and ``scrapy crawl`` exits with 1.

Why: Scrapy stops its reactor at once when the engine is not running yet (a crawler
still in ``open_spider``: ``Crawler.stop_async`` has nothing to stop), abandoning the
crawl where it was: a worker stopped in its start wait for Redis logged nothing after
"Received SIGINT" and exited with 0, as if it had crawled. So while the scheduler opens,
a "before shutdown" trigger of the reactor (:class:`StopAtStart`) cuts the wait short and
holds the shutdown until the crawl has closed as refused (at most
:data:`STOP_CLOSE_TIMEOUT`), which is what makes Scrapy count the crawl as failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred

from scrapy_ha.store.start_wait import Halt, StoppedAtStart

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["STOP_CLOSE_TIMEOUT", "StopAtStart"]

#: Seconds the reactor's shutdown waits for a crawl stopped at start to close as refused:
#: nothing was sent to Redis, so that close takes milliseconds; the bound keeps a close
#: that hangs from holding the shutdown (a second Ctrl-C cannot end it once it began).
STOP_CLOSE_TIMEOUT = 10.0


class StopAtStart(Halt):
    """A :class:`~scrapy_ha.store.start_wait.Halt` the reactor's shutdown sets while the
    scheduler opens (:meth:`watching`). Make it in the crawl's task (Scrapy builds the
    scheduler there, in ``open_spider``): its end is what the shutdown waits for."""

    def __init__(self) -> None:
        super().__init__()
        try:
            self.crawl: asyncio.Task[Any] | None = asyncio.current_task()
        except RuntimeError:  # built outside an event loop (a test): nothing to wait for
            self.crawl = None

    @contextlib.contextmanager
    def watching(self, redis_url: str) -> Iterator[None]:
        """While the scheduler opens, a stop cuts its start wait short; an open that a stop
        came during and that went on (Redis had answered) is refused when it ends
        (:class:`StoppedAtStart`)."""
        # never imported here: with TWISTED_REACTOR_ENABLED=False there is none, and the
        # import would install one
        reactor: Any = sys.modules.get("twisted.internet.reactor")
        trigger = None
        if reactor is not None:
            trigger = reactor.addSystemEventTrigger("before", "shutdown", self._shutting_down)
        try:
            yield
        finally:
            if trigger is not None:
                reactor.removeSystemEventTrigger(trigger)
        if self.stopped:
            raise StoppedAtStart(
                f"stopped while it opened the crawl at Redis at {redis_url}: the crawl did not "
                "start"
            )

    def _shutting_down(self) -> Deferred[None] | None:
        """The reactor shuts down (Scrapy's first Ctrl-C or SIGTERM): stop the start, and
        hold the shutdown until the crawl's task has ended (its refusal closed it)."""
        self.stop()
        crawl = self.crawl
        if crawl is None or crawl.done():
            return None
        closed: Deferred[None] = Deferred()
        timer: Any = None

        def end(*_: object) -> None:
            if timer is not None and timer.active():
                timer.cancel()
            if not closed.called:
                closed.callback(None)

        # (after Scrapy's own done callback, added first, which counts the crawl as failed)
        crawl.add_done_callback(end)
        timer = sys.modules["twisted.internet.reactor"].callLater(STOP_CLOSE_TIMEOUT, end)
        return closed
