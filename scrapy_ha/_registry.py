"""Which scrapy-ha scheduler runs a crawl: the one link from the middlewares to it.

The scheduler registers itself when it is built; a middleware asks :func:`scheduler_for`
when it needs the crawl's Redis or clock. This module imports no other scrapy-ha module,
so the middlewares reach the scheduler without an import cycle (the scheduler is typed
here only for readers, under ``TYPE_CHECKING``).
"""

from __future__ import annotations

import sys
import weakref
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from scrapy_ha.scheduler import Scheduler

__all__ = ["register", "scheduler_for"]

_SCHEDULERS: weakref.WeakKeyDictionary[Crawler, Scheduler] = weakref.WeakKeyDictionary()


def register(crawler: Crawler, scheduler: Scheduler) -> None:
    """Make *scheduler* the one :func:`scheduler_for` returns for *crawler*."""
    _SCHEDULERS[crawler] = scheduler


def scheduler_for(crawler: Crawler) -> Scheduler | None:
    """The scrapy-ha scheduler of a running crawl, or None if it uses another scheduler."""
    scheduler = _SCHEDULERS.get(crawler)
    if scheduler is None:
        scheduler = _legacy_lookup(crawler)
    return scheduler


def _legacy_lookup(crawler: Crawler) -> Scheduler | None:
    """The scheduler's own map, for a scheduler that does not call :func:`register` yet.

    Read from ``sys.modules`` (no import): a crawl whose scheduler module was never loaded
    has no scrapy-ha scheduler. Goes once ``Scheduler.__init__`` calls :func:`register`.
    """
    module: Any = sys.modules.get("scrapy_ha.scheduler")
    schedulers = getattr(module, "_SCHEDULERS", None)
    if schedulers is None:
        return None
    return cast("Scheduler | None", schedulers.get(crawler))
