"""Less for the garbage collector to walk: the start-up heap frozen (``HA_GC_FREEZE``), and
the reactor's cancelled timers swept (``HA_TIMER_SWEEP``).

Python's cyclic garbage collector walks every object it tracks at each collection of its
oldest generation: in a Scrapy worker those are mostly what start-up made (modules, classes,
functions, the crawler, its components and their settings), some 100,000 objects that live
as long as the crawl. A crawl allocates fast enough to trigger such a collection every few
seconds, and on the static-site benchmark (docs/benchmarks.md) the collector took 22-30% of
the worker's CPU, half of it walking that start-up heap again and again.

So once the worker is connected, the scheduler collects once and freezes what is alive
(``gc.freeze()``): those objects are never walked again, but still freed by reference
counting; only a reference cycle among them that becomes garbage during the crawl stays
until the crawl closes. The scheduler unfreezes them (``gc.unfreeze()``) ``THAW_DELAY``
seconds after its close (at once without a Twisted reactor), so that a process that runs
several crawls frees each one's start-up objects after it (at once when the next crawl
opens first), while a process that stops its reactor right after the crawl (``scrapy
crawl``, a scrapyd job) exits without that last pass of the collector over its whole heap:
unfrozen, Python's own collection at exit walks every object again (about 0.2 G
instructions, 5 % of a worker's start-up and close in the static-site benchmark,
docs/benchmarks.md). Freezing is the whole process's: a crawler that finds something
frozen already (another crawler of the process, or the host application) leaves it to
whoever froze it. The same freeze saves a crawl with Scrapy's own scheduler as much: it is
not scrapy-ha's cost it removes.

Every download arms a Twisted timer for its ``DOWNLOAD_TIMEOUT`` (180 s) and cancels it when
the response arrives, and every connection put back in the pool one for its idle timeout
(240 s). Twisted's reactors drop cancelled timers from their queue when they run their due
ones (``ReactorBase.runUntilCurrent``), which the asyncio reactor (Scrapy's default) does only
when one of its timers is due: in a busy crawl none is for minutes, and every cancelled timer
stays queued until its own time comes, with two bound methods: three objects more per timer
for each pass of the collector, about 20,000 timers at the end of a 20 s crawl at 500
pages/s. So a no-op Twisted timer runs every ``HA_TIMER_SWEEP`` seconds while the worker
crawls, with the asyncio reactor only: each run lets the reactor drop what was cancelled
meanwhile.
"""

from __future__ import annotations

import gc
import logging
import sys
from typing import Any

from twisted.internet import task

logger = logging.getLogger(__name__)

#: Seconds from a crawl's close to its heap's thaw, while the reactor runs.
THAW_DELAY = 5.0
#: Objects Python itself keeps frozen: Python 3.12 puts its immortal objects in the
#: permanent generation (some 400, there from start-up), so that a count of frozen objects
#: up to this one is nobody's ``gc.freeze()``. A host application that froze before this
#: module was imported is not told apart: its objects are thawed with the crawl's.
PYTHON_FROZEN = gc.get_freeze_count() if sys.version_info[:2] == (3, 12) else 0


class _Thaw:
    """The process's one pending thaw: a crawl closed, its freeze not yet undone."""

    call: Any = None  # the reactor's delayed call
    trigger: Any = None  # the shutdown trigger that drops it

    @classmethod
    def later(cls, reactor: Any) -> None:
        cls.call = reactor.callLater(THAW_DELAY, thaw_pending)
        # a reactor that stops never runs the call; one whose shutdown outlasts the delay
        # is stopping too: the thaw is dropped at its start
        cls.trigger = reactor.addSystemEventTrigger("before", "shutdown", cls.drop, False)

    @classmethod
    def drop(cls, remove_trigger: bool = True) -> bool:
        """Forgets a pending thaw (the freeze stays): whether there was one. The trigger
        itself passes False: Twisted warns when a trigger that ran is removed."""
        call, trigger = cls.call, cls.trigger
        if call is None:
            return False
        cls.call = cls.trigger = None
        if call.active():
            call.cancel()
        reactor = sys.modules.get("twisted.internet.reactor")
        if remove_trigger and reactor is not None:
            reactor.removeSystemEventTrigger(trigger)
        return True


def thaw_pending() -> bool:
    """Thaws now what a closed crawl left frozen for later: whether it did (its delayed
    call, a new crawl's freeze, tests, a host application that wants its heap back)."""
    if not _Thaw.drop():
        return False
    gc.unfreeze()
    return True


class FrozenHeap:
    """Freezes the heap once at open, unfreezes it at close."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.frozen = 0  # objects frozen at open (0: none)

    def freeze(self) -> None:
        """Unless something froze already (another crawler of this process, or the host
        application's own ``gc.freeze()``, which its owner undoes, not this one). A freeze
        that an earlier crawl of this process left for its delayed thaw is this one's now:
        thawed first, so that the collection frees that crawl's start-up objects."""
        if not self.enabled or self.frozen:
            return
        if not thaw_pending() and gc.get_freeze_count() > PYTHON_FROZEN:
            return
        gc.collect()  # garbage made at start-up is freed now, not frozen with the rest
        gc.freeze()
        self.frozen = gc.get_freeze_count()
        logger.debug("Froze %d start-up objects out of the garbage collector's passes", self.frozen)

    def thaw(self) -> None:
        """At close: ``THAW_DELAY`` seconds later while the reactor runs, else at once."""
        if not self.frozen:
            return
        self.frozen = 0
        reactor = sys.modules.get("twisted.internet.reactor")
        if reactor is None or not getattr(reactor, "running", False):
            gc.unfreeze()
        elif _Thaw.call is None:
            _Thaw.later(reactor)


class TimerSweep:
    """A no-op Twisted timer every *interval* seconds (0: none), with the asyncio reactor."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._call: task.LoopingCall | None = None

    def start(self) -> None:
        # never imported here: with TWISTED_REACTOR_ENABLED=False there is none, and the
        # import would install one
        reactor = sys.modules.get("twisted.internet.reactor")
        if not self.interval or self._call is not None or not _asyncio_reactor(reactor):
            return
        self._call = task.LoopingCall(_nothing)
        self._call.start(self.interval, now=False)

    def stop(self) -> None:
        if self._call is not None and self._call.running:
            self._call.stop()
        self._call = None


def _nothing() -> None:
    """Its run is the point: the reactor drops cancelled timers when it runs due ones."""


def _asyncio_reactor(reactor: object) -> bool:
    from twisted.internet.asyncioreactor import AsyncioSelectorReactor

    return isinstance(reactor, AsyncioSelectorReactor)
