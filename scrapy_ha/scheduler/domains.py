"""What holds a leased request back for its domain in the shell: a start time its domain's
crawl-wide rate gave it (``HA_DOMAIN_RATE``), or a gate closed for every worker (a 429
with Retry-After). Neither polls: a timer wakes the engine when the first may go."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from scrapy_ha import metakeys
from scrapy_ha.store.hosts import url_host

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request

__all__ = ["ClosedDomains", "StartTimes"]

logger = logging.getLogger(__name__)


class StartTimes:
    """Leased requests held in the worker's buffer until the start time their domain's
    crawl-wide rate gave them (the lease's ``wait_ms``); one timer wakes the engine at the
    earliest of them, and it looks again.

    Redis spaces a domain's start times 1/rate apart or more, but a worker whose event loop
    stalled (a callback that blocks it, a machine short of CPU) finds several of them past
    at once. After a start later than its time by more than :data:`LATE_S`, the domain's
    next request waits at least :data:`CATCH_UP` of the spacing: the late ones go out at
    up to 4/3 of this worker's pace, not all at once, until it is back on Redis's times.
    The spacing is this worker's share of the domain's starts: the median gap of the start
    times Redis gave its last leases of the domain (with N workers, about N/rate; a
    stall's gap is one outlier), and at least the 1/rate of its own settings. On time,
    nothing changes: each request keeps its own time, and lateness does not add up. A
    stall shorter than LATE_S is not paced: its late starts, at most the rate times 50 ms,
    go at once (a threshold of a quarter of the spacing was tried: at a rate of 200, on a
    machine busy with a test suite, 183 and 128 starts a second against 199 and 170
    without the pacing)."""

    #: The part of the spacing of two requests of a domain kept after a late start.
    CATCH_UP = 0.75
    #: Seconds a start may be late and hold nothing: an event loop's jitter under load.
    LATE_S = 0.05
    #: Start times of a domain's leases remembered for the spacing (their median gap).
    LEASES_SEEN = 7
    #: Seconds between two sweeps of the domains started, and after which one is forgotten.
    SWEEP_S, FORGET_S = 1.0, 10.0

    def __init__(
        self,
        wake: Callable[[], None],
        interval: Callable[[str], float],
        unsent: Callable[[Request], bool] = lambda request: False,
    ) -> None:
        self._wake = wake
        #: does the request's download slot hold one it has not sent (see :meth:`waits`)?
        self._unsent = unsent
        self._timer_at: float | None = None
        self._interval = interval  # a domain -> 1/its rate in this worker's settings (0: none)
        #: domain -> (when this worker last started one of its requests, that one's start time)
        self._last: dict[str, tuple[float, float]] = {}
        #: domain -> the start times Redis gave this worker's last leases of it
        self._leased: dict[str, deque[float]] = {}
        #: domain -> the median gap between them (see the class)
        self._share: dict[str, float] = {}
        self._swept = 0.0

    def hold(self, request: Request, wait_ms: int) -> None:
        """Hold *request* until its start time (now: 0); paced after a late start of its
        domain if the domain has a rate (Redis gave it a wait, or this worker's settings)."""
        meta = request.meta
        at = meta[metakeys.NOT_BEFORE] = time.monotonic() + wait_ms / 1000
        domain = url_host(request.url)
        interval = self._interval(domain)
        if interval > 0 or wait_ms > 0:
            meta[metakeys.PACED] = (meta[metakeys.LEASE][0], domain, interval)
            times = self._leased.get(domain)
            if times is None:
                times = self._leased[domain] = deque(maxlen=self.LEASES_SEEN)
            times.append(at)
            ordered = sorted(times)
            gaps = sorted(b - a for a, b in zip(ordered, ordered[1:], strict=False) if b > a)
            self._share[domain] = gaps[len(gaps) // 2] if gaps else 0.0

    def waits(self, request: Request) -> bool:
        """*request* may not start yet (a timer wakes the engine at its time)."""
        meta = request.meta
        not_before = meta.get(metakeys.NOT_BEFORE)
        if not_before is None:
            return False
        if (paced := _paced(meta)) is not None and (last := self._last.get(paced[0])):
            started, at = last
            spacing = max(paced[1], self._share.get(paced[0], 0.0))
            if started - at > self.LATE_S and spacing > 0:
                # (one Redis timed before the last started is late too: the whole spacing)
                gap = spacing if not_before <= at else min(not_before - at, spacing)
                not_before = max(not_before, started + self.CATCH_UP * gap)
        if not_before <= time.monotonic():
            # its time came; a paced one also waits while its download slot holds one it has
            # not sent (queued behind the slot's delay: AutoThrottle's, DOWNLOAD_DELAY), and
            # goes when that one's download ends (which wakes the engine), late: then paced.
            # Else the slot queued each at its time and, its delay falling (AutoThrottle as
            # the site answered fast), sent the queue at once: 9 of one worker in 0.5 s at 5/s.
            return paced is not None and self._unsent(request)
        if self._timer_at is None or not_before < self._timer_at:
            self._timer_at = not_before  # else an earlier timer wakes the engine first
            asyncio.get_running_loop().call_later(not_before - time.monotonic(), self._fire)
        return True

    def started(self, request: Request) -> None:
        """*request* was handed to the engine: its domain's next one is spaced from it."""
        meta = request.meta
        if (paced := _paced(meta)) is None:
            return
        domain = paced[0]
        now, at = time.monotonic(), meta[metakeys.NOT_BEFORE]
        last = self._last.get(domain)
        self._last[domain] = (now, at if last is None else max(at, last[1]))
        if now - self._swept >= self.SWEEP_S:
            self._swept = now
            old = now - self.FORGET_S
            self._last = {d: v for d, v in self._last.items() if v[0] > old}
            self._leased = {d: v for d, v in self._leased.items() if v and v[-1] > old}
            self._share = {d: v for d, v in self._share.items() if d in self._leased}

    def _fire(self) -> None:
        self._timer_at = None
        self._wake()


def _paced(meta: dict[str, Any]) -> tuple[str, float] | None:
    """The domain and 1/rate (this worker's setting, 0: none) of a request held for its
    start time under its current lease (not a redirect or a copy that took the meta of
    one: its lease differs)."""
    paced = meta.get(metakeys.PACED)
    if paced is None or paced[0] != meta.get(metakeys.LEASE, (None,))[0]:
        return None
    return str(paced[1]), float(paced[2])


class ClosedDomains:
    """Domains closed for every worker, by Redis's word or this worker's: domain ->
    ``time.monotonic()`` when it opens. A domain is a request's host as its back queue
    names it (:func:`~scrapy_ha.store.hosts.url_host`: an IPv6 literal keeps its brackets),
    so that the gate Redis keeps holds that queue back.

    Redis's latest word on a domain replaces this worker's copy (a gate an operator opened,
    then a 429 closed for less, is that shorter gate: before, the copy only grew), but for
    the closes of this worker not sent yet (*unsent*: the outbox's, domain -> seconds),
    which a reply of a call made before them cannot know of."""

    #: Seconds between two sweeps of the gates that opened (a check per request costs
    #: nothing while none is known; one sweep a second costs nothing at 50,000)
    SWEEP_S = 1.0

    def __init__(self, unsent: dict[str, float] | None = None) -> None:
        self.until: dict[str, float] = {}
        #: domain -> when (``time.monotonic()``) this worker first knew its gate closed
        self.since: dict[str, float] = {}
        self._unsent = unsent if unsent is not None else {}
        #: domain -> when this worker's own close opens, while it is in *unsent*
        self._own: dict[str, float] = {}
        self._swept = 0.0

    def learn(self, gates: dict[str, float], *, every: bool) -> None:
        """Take Redis's word on the domains of *gates* (closed until a time, or open now:
        expired, or opened early by an operator, ``scrapy-ha gates open``); with *every*,
        the others are open too: the log Redis kept was lost, and their gates with it."""
        until = self.until
        own = {d: t for d, t in self._own.items() if d in self._unsent}
        self._own = own
        if every:
            until.clear()
            until.update(own)
        now = time.monotonic()
        for domain, opens in gates.items():
            opens = max(opens, own.get(domain, 0.0))
            if opens > now:
                self._closing(domain, now)
                until[domain] = opens
            elif (was := until.pop(domain, None)) is not None:
                self.since.pop(domain, None)
                if was > now + 1:  # not its time: an operator opened it (before: unsaid)
                    logger.info(
                        "Domain %s opened for every worker %.0f s before its gate's time "
                        "(`scrapy-ha gates open` or the dashboard): its requests go again",
                        domain,
                        was - now,
                    )
        if until and now >= self._swept + self.SWEEP_S:
            self._swept = now
            for domain in [d for d, opens in until.items() if opens <= now]:
                del until[domain]
                self.since.pop(domain, None)

    def _closing(self, domain: str, now: float) -> None:
        """Note when *domain*'s gate closed, if it was open (a longer close keeps it)."""
        if self.until.get(domain, 0) <= now:
            self.since[domain] = now

    def __bool__(self) -> bool:
        return bool(self.until)

    def close(self, request: Request, seconds: float) -> str | None:
        """Close *request*'s domain for *seconds*; its domain if that closes it for longer
        than it was (Redis must learn it), else None."""
        domain = url_host(request.url)
        now = time.monotonic()
        until = now + seconds
        if until <= self.until.get(domain, 0):
            return None
        self._closing(domain, now)
        self.until[domain] = self._own[domain] = until
        return domain

    def sent_before(self, request: Request) -> float:
        """Seconds until *request*'s domain opens if its gate closed after *request* went
        to the engine (``meta["_ha_handed"]``), else 0: a 429 to such a request is the
        site's answer to a request sent too soon, not an attempt of its own (one handed out
        later was held back at the hand-out: its 429 is an attempt)."""
        domain = url_host(request.url)
        wait = self.until.get(domain, 0.0) - time.monotonic()
        handed = request.meta.get(metakeys.HANDED)
        if wait <= 0 or not isinstance(handed, float) or domain not in self.since:
            return 0.0
        return wait if handed < self.since[domain] else 0.0

    def wait(self, request: Request) -> float:
        """Seconds until *request*'s domain opens (<= 0: open)."""
        return self.until.get(url_host(request.url), 0.0) - time.monotonic()
