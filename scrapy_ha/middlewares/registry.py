"""Which scrapy-ha scheduler runs a crawl: the one link from the middlewares to it.

The scheduler registers itself when it is built; a middleware asks :func:`scheduler_for`
when it needs the crawl's Redis or clock. What a middleware may use of the scheduler is
:class:`CrawlScheduler`: this module imports no other scrapy-ha module at run time, and the
middlewares never name the scheduler's class.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

    from scrapy_ha.config.scheduler import SchedulerConfig
    from scrapy_ha.store.queue import RedisQueue

__all__ = ["CrawlScheduler", "register", "scheduler_for"]


class Runs(Protocol):
    """What the middlewares read of a worker's admission of requests
    (:class:`scrapy_ha.scheduler.admission.Admission`): the crawl's run it joined."""

    run: int


class Gates(Protocol):
    """What the middlewares read of the domains whose gate a worker knows closed
    (:class:`scrapy_ha.scheduler.domains.ClosedDomains`)."""

    def sent_before(self, request: Request) -> float:
        """Seconds until the domain opens if its gate closed while *request* downloaded."""


class CrawlScheduler(Protocol):
    """What the middlewares use of a crawl's scheduler
    (:class:`scrapy_ha.scheduler.Scheduler`)."""

    @property
    def config(self) -> SchedulerConfig: ...
    @property
    def queue(self) -> RedisQueue | None:
        """The crawl's queue once open (read each time: a reconnect makes a new client)."""

    @property
    def admission(self) -> Runs:
        """The crawl's run this worker joined (``admission.run``: 1, 2, ...)."""

    def server_time_ms(self) -> int:
        """The Redis server's clock, estimated from the last round trip."""

    def close_gate(self, request: Request, seconds: float) -> None:
        """Close the request's domain for every worker for *seconds*."""

    @property
    def closed(self) -> Gates:
        """The domains whose gate this worker knows closed."""

    def save_checkpoint(
        self, page: Request, task: str, doc: bytes, ttl_ms: int, *, at_finish: bool
    ) -> None:
        """Save *task*'s checkpoint under *page*'s lease: now, or when the page is acked."""


_SCHEDULERS: weakref.WeakKeyDictionary[Crawler, CrawlScheduler] = weakref.WeakKeyDictionary()


def register(crawler: Crawler, scheduler: CrawlScheduler) -> None:
    """Make *scheduler* the one :func:`scheduler_for` returns for *crawler*."""
    _SCHEDULERS[crawler] = scheduler


def scheduler_for(crawler: Crawler) -> CrawlScheduler | None:
    """The scrapy-ha scheduler of a running crawl, or None if it uses another scheduler."""
    return _SCHEDULERS.get(crawler)
