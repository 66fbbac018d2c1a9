"""The pool proxies' cool-downs shared by the crawl's workers through Redis.

Shared health is an optimisation: a Redis error leaves each worker its own view of the
proxies (one WARNING, ``ha/proxy/redis_errors``), never a failed request. Cool-downs are
scored by the Redis server's clock (workers' clocks differ).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from scrapy_ha.middlewares.registry import scheduler_for
from scrapy_ha.store.state import ProxyCooldowns

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

__all__ = ["SharedCooldowns"]

logger = logging.getLogger(__name__)


class SharedCooldowns:
    """Reads and writes the crawl's ``ha:{S}:proxy_cd`` for the proxy middleware."""

    def __init__(self, crawler: Crawler, cooldown: float) -> None:
        self.crawler = crawler
        self.cooldown = cooldown
        self._warned = False

    async def load(self) -> dict[str, float]:
        """Other workers' cool-downs (until, on this worker's clock); expired ones are
        deleted. A Redis error leaves the local view: an empty answer."""
        store, server_ms = self._store()
        if store is None:
            return {}
        try:
            cooling = await store.load(server_ms)
        except Exception as exc:
            self._failed("read the shared proxy cool-downs", exc)
            return {}
        offset = time.time() - server_ms / 1000  # server -> local clock
        return {pid: until / 1000 + offset for pid, until in cooling.items()}

    async def share(self, pid: str) -> None:
        """Tell the other workers (by the Redis server's clock: workers' clocks differ);
        *pid* as :func:`scrapy_ha.middlewares.proxy_sources.cooling_key` writes it."""
        store, server_ms = self._store()
        if store is None:
            return
        try:
            await store.mark(pid, server_ms, int(self.cooldown * 1000))
        except Exception as exc:  # never fail a request for it
            self._failed(f"share the cool-down of {pid}", exc)

    def _failed(self, what: str, exc: Exception) -> None:
        stats = self.crawler.stats
        if stats is not None:
            stats.inc_value("ha/proxy/redis_errors")
        if not self._warned:
            self._warned = True
            logger.warning(
                "Could not %s in Redis (%s): this worker goes on with its own view "
                "of the proxies' health",
                what,
                exc,
            )

    def _store(self) -> tuple[ProxyCooldowns | None, int]:
        """The crawl's shared cool-downs and the Redis server's clock (None without
        scrapy-ha's scheduler)."""
        scheduler = scheduler_for(self.crawler)
        if scheduler is None or scheduler.queue is None:
            return None, 0
        store = ProxyCooldowns(scheduler.queue.client, scheduler.queue.keys)  # a reconnect
        return store, scheduler.server_time_ms()  # makes a new client: read it each time
