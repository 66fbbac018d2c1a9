"""Which scrapy-ha scheduler runs a crawl: the one link from the middlewares to it.

The scheduler registers itself when it is built; a middleware asks :func:`scheduler_for`
when it needs the crawl's Redis or clock. This module imports no other scrapy-ha module,
so the middlewares reach the scheduler without an import cycle (the scheduler is typed
here only for readers, under ``TYPE_CHECKING``).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from scrapy_ha.scheduler.shell import Scheduler

__all__ = ["register", "scheduler_for"]

_SCHEDULERS: weakref.WeakKeyDictionary[Crawler, Scheduler] = weakref.WeakKeyDictionary()


def register(crawler: Crawler, scheduler: Scheduler) -> None:
    """Make *scheduler* the one :func:`scheduler_for` returns for *crawler*."""
    _SCHEDULERS[crawler] = scheduler


def scheduler_for(crawler: Crawler) -> Scheduler | None:
    """The scrapy-ha scheduler of a running crawl, or None if it uses another scheduler."""
    return _SCHEDULERS.get(crawler)
