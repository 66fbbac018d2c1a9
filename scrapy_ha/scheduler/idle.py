"""When a worker's spider may close: Scrapy's ``spider_idle`` answered from what the
worker holds and what Redis said at the last sync."""

from __future__ import annotations

import asyncio
import time
from functools import partial
from typing import TYPE_CHECKING, Protocol

from scrapy.exceptions import DontCloseSpider

from scrapy_ha.scheduler import engine

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.crawler import Crawler

    from scrapy_ha.scheduler.remote import Remote

__all__ = ["IdleClose"]


class SessionView(Protocol):
    @property
    def remote(self) -> Remote: ...
    def wake(self) -> None: ...


class IdleClose:
    """The ``spider_idle`` handler of one worker."""

    def __init__(
        self,
        crawler: Crawler,
        idle_timeout: float,
        keep_alive: Callable[[], bool],
        unacked: Callable[[], bool],
        session: SessionView,
    ) -> None:
        self._crawler = crawler
        self._timeout = idle_timeout  # HA_IDLE_TIMEOUT
        self._keep_alive = keep_alive  # the crawl may still have work
        self._unacked = unacked  # finished requests not acked yet
        self._session = session
        self._since: float | None = None  # when the crawl first looked finished with peers

    def on_idle(self) -> None:
        """Close at once when the crawl is verifiably finished: nothing local, nothing
        pending, leased or delayed in Redis at a sync made after this worker's last ack,
        and no other live worker; with live peers (they may still be yielding start
        requests) wait ``HA_IDLE_TIMEOUT`` first. No polling: a timer wakes the engine."""
        view = self._session.remote.engine_view
        if self._keep_alive() or view is None or view[1]:
            self._since = None
            if self._unacked():
                # the engine is idle: what it finished is acked now, not at the next tick
                self._session.wake()
            raise DontCloseSpider
        if not self._session.remote.peers:
            return
        now = time.monotonic()
        if self._since is None:
            self._since = now
        if now - self._since < self._timeout:
            asyncio.get_running_loop().call_later(
                self._timeout - (now - self._since) + 0.05,
                partial(engine.wake, self._crawler),
            )
            raise DontCloseSpider
