"""The shell as the session sees it: what the background task reads of the scheduler's
shell and the calls it makes on it. :class:`scrapy_ha.scheduler.shell.Scheduler` is the one
implementation; the session never imports it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from scrapy_ha.config.scheduler import SchedulerConfig
    from scrapy_ha.scheduler.admission import Admission
    from scrapy_ha.scheduler.fresh import Handout
    from scrapy_ha.scheduler.inflight import InFlight
    from scrapy_ha.scheduler.outbox import Outbox, Pair
    from scrapy_ha.scheduler.precedence import Precedence
    from scrapy_ha.store.wire import Lease

__all__ = ["Shell"]


class Shell(Protocol):
    """What the engine's calls fill (the outbox, the requests in flight, the hand-out of new
    requests), and the calls that hand the shell what Redis said."""

    crawler: Crawler
    stats: StatsCollector
    #: replaced once the spider is known (a scrapyd job id names the worker)
    config: SchedulerConfig
    outbox: Outbox
    admission: Admission
    inflight: InFlight
    handout: Handout
    precedence: Precedence

    def take(self, request: Request, lease: Lease) -> None:
        """Buffer a request the session leased."""

    def drop_lost(self, lost: set[Pair]) -> None:
        """Forget the buffered requests of leases Redis says were lost."""

    def set_gates(self, gates: dict[str, float], *, every: bool) -> None:
        """Domains closed for every worker: domain -> monotonic time it opens (with
        *every*, all of them: the others known before are open)."""

    def local_leases(self) -> list[Pair]:
        """Leases buffered or in flight."""

    def forget_local(self) -> None:
        """Drop everything held (at close, once released)."""

    def want(self) -> int:
        """Requests to lease in the next sync."""

    def make_room(self) -> None:
        """Give back what the buffer holds past its bound."""

    def buffered(self) -> int: ...
    def room_for_start_urls(self) -> bool: ...
    def has_pending_requests(self) -> bool: ...
    def keep_alive(self) -> bool: ...
