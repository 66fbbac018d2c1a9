"""Keeping a worker's leases renewed: the session's glue to :mod:`scrapy_ha._keeper`.

Renewal runs from the keeper's thread once the session has connected (before that, and in
tests without a keeper, the session renews on the event loop). Every renewal vouches for
the leases held at its start for one ``HA_LEASE_TIME``: the shell hands out buffered
requests only while that holds. The acks counted between two renewals give the rate that
caps the prefetch (no more leased than can be done within half a lease period).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from scrapy_ha._keeper import LeaseKeeper, LoopWatch, sync_redis_from_settings

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.settings import BaseSettings

    from scrapy_ha._keeper import Pairs
    from scrapy_ha._queue import RedisQueue
    from scrapy_ha.config import SchedulerConfig


class Renewals:
    """Renews what ``held()`` names; calls ``on_lost`` with the (id, token) pairs lost."""

    def __init__(
        self,
        settings: BaseSettings,
        config: Callable[[], SchedulerConfig],
        held: Callable[[], Pairs],
        on_lost: Callable[[set[tuple[str, str]]], None],
    ) -> None:
        self.settings = settings
        self.config = config  # read at each use: the worker id is final only once connected
        self.held = held
        self.on_lost = on_lost
        self.keeper: LeaseKeeper | None = None  # renews from its own thread
        self.watch: LoopWatch | None = None
        self.valid_until = 0.0  # monotonic time until which every held lease is valid
        self.rate = 0.0  # acks per second, measured between renewals
        self.acked = 0  # acks since the last renewal
        self._last_renew = 0.0

    def due(self, now: float) -> bool:
        """A renewal from the event loop is due (no keeper thread runs)."""
        return self.keeper is None and now - self._last_renew >= self.config().renew_interval

    def start_keeper(self, queue: RedisQueue) -> None:
        """Renew and heartbeat from a thread from now on (see :mod:`scrapy_ha._keeper`)."""
        config = self.config()
        client = sync_redis_from_settings(self.settings, connect_timeout=config.connect_timeout)
        self.keeper = LeaseKeeper(
            client,
            queue.keys,
            worker=config.worker_id,
            lease_time=config.lease_time,
            renew_interval=config.renew_interval,
            heartbeat_ttl=config.heartbeat_ttl,
            watchdog=config.renew_watchdog,
            loop=asyncio.get_running_loop(),
            on_renewed=self._on_renewed,
        )
        self.keeper.hold(self.held())
        self.keeper.start()
        self.watch = LoopWatch(self.keeper, self.held)
        self.watch.start()

    async def stop_keeper(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        if self.keeper is not None:
            keeper, self.keeper = self.keeper, None
            await asyncio.to_thread(keeper.stop)

    def _on_renewed(self, started: float, lost: list[tuple[str, str]]) -> None:
        """A renewal by the keeper's thread (run on the event loop)."""
        if self.keeper is None:
            return
        self._note_rate(started)
        self.valid_until = started + self.config().lease_time
        if lost:  # leases given up since the snapshot (acked, released) are not lost
            if real := set(lost) & set(self.held()):
                self.on_lost(real)

    async def renew(self, queue: RedisQueue) -> None:
        """Renew from the event loop (at connect, and while no keeper thread runs)."""
        config = self.config()
        started = time.monotonic()
        _, lost = await queue.renew(
            list(self.held()),
            worker=config.worker_id,
            lease_ms=int(config.lease_time * 1000),
            heartbeat_ms=int(config.heartbeat_ttl * 1000),
            rate=self.rate,
        )
        self._note_rate(started)
        self.valid_until = started + config.lease_time
        if lost:
            self.on_lost(set(lost))

    def _note_rate(self, now: float) -> None:
        if self._last_renew:
            self.rate = self.acked / max(0.001, now - self._last_renew)
            if self.keeper is not None:
                self.keeper.rate = self.rate
        self.acked = 0
        self._last_renew = now
