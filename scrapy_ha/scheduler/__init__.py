"""The scheduler Scrapy runs (``SCHEDULER = "scrapy_ha.Scheduler"``).

Two halves meet in one typed outbox (:mod:`.outbox`): the shell (:mod:`.shell`, with its
helpers in this package) answers the engine from memory and never waits on Redis; the
session (:mod:`.session`) is the one background task that talks to Redis. Engine
internals are read in :mod:`.engine` only.
"""

import gc

# The collector paused while the scheduler is imported (it, redis-py and the rest make some
# 50,000 objects and no garbage to speak of): in a worker the import set off a full
# collection over the whole start-up heap (about 35 ms of CPU on the static-site benchmark)
# moments before the freeze's own (heap.py), which finds the same objects alive. Left as
# the import found it, whatever it was.
_COLLECTING = gc.isenabled()
try:
    gc.disable()
    from scrapy_ha.middlewares.registry import scheduler_for
    from scrapy_ha.scheduler.shell import START_FAILED, Scheduler
finally:
    if _COLLECTING:
        gc.enable()
del _COLLECTING

__all__ = ["START_FAILED", "Scheduler", "scheduler_for"]
