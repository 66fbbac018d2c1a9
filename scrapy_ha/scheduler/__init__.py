"""The scheduler Scrapy runs (``SCHEDULER = "scrapy_ha.Scheduler"``).

Two halves meet in one typed outbox (:mod:`.outbox`): the shell (:mod:`.shell`, with its
helpers in this package) answers the engine from memory and never waits on Redis; the
session (:mod:`.session`) is the one background task that talks to Redis. Engine
internals are read in :mod:`.engine` only.
"""

from scrapy_ha.middlewares.registry import scheduler_for
from scrapy_ha.scheduler.shell import START_FAILED, Scheduler

__all__ = ["START_FAILED", "Scheduler", "scheduler_for"]
