"""A suspect runs alone (Sidekiq Pro's poison pill, without its collateral).

A request whose lease expired on its last-but-one chance before the dead-letter queue
(``HA_MAX_LEASE_EXPIRIES``) may be what kills workers. A worker runs it with nothing else in
flight or buffered, so that only its own lease can expire with it and innocent neighbours
never reach the poison threshold, and only once Redis knows it was handed out (one renewal:
a request that kills its worker at once must count toward poison). Meanwhile the worker
hands out nothing else, and leases nothing (:meth:`Solo.running`).
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Protocol

from scrapy_ha import metakeys
from scrapy_ha.scheduler import engine

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.crawler import Crawler

    from scrapy_ha.scheduler.buffer import LeaseBuffer
    from scrapy_ha.scheduler.inflight import InFlight
    from scrapy_ha.scheduler.outbox import Outbox, Pair

logger = logging.getLogger("scrapy_ha.scheduler")


class Announcer(Protocol):
    """How a suspect's hand-out reaches Redis before it runs (the session's renewals)."""

    def announce(self, pair: Pair, then: Callable[[], None]) -> None: ...
    def announcing(self) -> bool: ...
    def reported(self, pair: Pair) -> bool: ...


class Solo:
    """The suspect this worker runs alone, if any (its entry id)."""

    def __init__(
        self, buffer: LeaseBuffer, inflight: InFlight, outbox: Outbox, crawler: Crawler
    ) -> None:
        self._buffer = buffer
        self._inflight = inflight
        self._outbox = outbox
        self._crawler = crawler
        #: the session's renewals and wake-up, set once the scheduler made its session
        self.announcer: Announcer | None = None
        self.wake: Callable[[], None] = lambda: None
        self.entry_id: str | None = None

    @property
    def running(self) -> bool:
        return self.entry_id is not None

    def isolating(self) -> bool:
        """True while a suspect runs alone, or waits for the engine to empty to do so."""
        assert self.announcer is not None
        if self.entry_id is not None:
            if self.entry_id in self._inflight:
                return True
            if not self.announcer.announcing():
                self.entry_id = None
        head = self._buffer[0] if self._buffer else None
        return bool(head is not None and head.meta.get(metakeys.SUSPECT) and self._inflight)

    def run_alone(self, request: Request, entry_id: str) -> bool:
        """Hand out the suspect *request* (True) once nothing else is in flight, the
        buffer is given back to Redis and Redis knows it was handed out; else False, and it
        stays first in line."""
        assert self.announcer is not None
        if self._inflight:
            self._buffer.appendleft(request)
            return False
        self._outbox.releases += [r.meta[metakeys.LEASE] for r in self._buffer]
        self._buffer.clear()
        self.entry_id = entry_id
        lease: Pair = (entry_id, request.meta[metakeys.LEASE][1])
        if not self.announcer.reported(lease):
            self._buffer.appendleft(request)
            self.announcer.announce(lease, partial(engine.wake, self._crawler))
            self.wake()
            return False
        assert self._crawler.stats is not None
        self._crawler.stats.inc_value("ha/suspects_isolated")
        logger.info(
            "Running %s alone: its lease expired %d time(s) before",
            request,
            request.meta[metakeys.SUSPECT],
        )
        self.wake()
        return True
