"""Back-pressure before Redis is full: a worker reads Redis's memory every second (every 30 s
while no mark can apply: fractions of a maxmemory that no server has), and while
``used_memory`` is above ``HA_REDIS_MEMORY_HIGH`` (90 % of ``maxmemory`` by default) and
until it falls below ``HA_REDIS_MEMORY_LOW`` (80 %), it holds back what would grow the
frontier:

- it leases no request (pending, or delayed and due), and hands none of its own new
  requests to its engine from memory (they go to Redis pending, as while paused);
- it feeds no start URL from a Redis list.

A worker that starts while memory is between the marks, after another worker of the
crawl held back, holds back too (it finds that worker's mark in Redis): the crawl holds
back as one until memory is below the low mark. It does not write the mark itself, and
leases again once the mark is gone (the workers that saw memory above the high mark left):
else workers replaced one by one between the marks would keep each other held for ever.

Everything else goes on, so nothing is lost and nothing waits on a lease: the pages it
holds finish, their children are stored (before their acks, as always), acks, retries and
dead letters are sent, leases renewed and expired ones reclaimed. The frontier then stops
growing once the pages in flight are done, and what was leased drains; pending requests
stay queued, never evicted, and are leased again once memory is below the low mark. The
worker says so in its log (a WARNING, then an INFO), counts it (``ha/backpressure/held``)
and marks the crawl in Redis (the ``pressure`` key, with a TTL) for ``scrapy-ha status``
and the exporter's ``scrapy_ha_backpressure`` gauge.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

import redis

from scrapy_ha.config.memory import MEMORY_CHECK_INTERVAL, MEMORY_UNBOUNDED_INTERVAL
from scrapy_ha.store.connection import server_ms
from scrapy_ha.store.health import is_cluster, primaries_info

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

    from scrapy_ha.config.memory import MemoryConfig
    from scrapy_ha.scheduler.remote import Remote
    from scrapy_ha.store.queue import RedisQueue

__all__ = ["Pressure"]

logger = logging.getLogger(__name__)

#: Lifetime of the crawl's ``pressure`` mark: a few checks, so that it goes by itself when
#: the workers that saw memory high are gone.
PRESSURE_TTL_MS = int(5 * MEMORY_CHECK_INTERVAL * 1000)


class Pressure:
    """One worker's view of Redis's memory against the back-pressure marks."""

    def __init__(
        self, config: MemoryConfig, stats: StatsCollector, remote: Remote, redis_url: str
    ) -> None:
        self.config = config
        self.stats = stats
        self.remote = remote
        self.redis_url = redis_url
        self._next = 0.0
        self._since_ms = 0
        #: held back only because other workers do (their mark): it does not keep the mark
        #: alive, so the hold ends once they are gone (a rolling restart between the marks)
        self._joined = False

    async def check(
        self, queue: RedisQueue, now: float | None = None, info: dict[str, Any] | None = None
    ) -> None:
        """Read Redis's memory if a check is due (its ``INFO`` read just before: *info*,
        unless read while Redis was still loading its data), and hold back or go on (see
        the module)."""
        now = time.monotonic() if now is None else now
        if now < self._next or not self.config.high:
            return
        self._next = now + MEMORY_CHECK_INTERVAL
        if not info or is_cluster(queue.client) or any(n.get("loading") for n in _nodes(info)):
            info = None  # (a cluster's, read at connect, is one node's; empty: INFO refused)
        if info is None:
            try:
                info = await primaries_info(queue.client, "memory")
            except redis.exceptions.NoPermissionError:  # INFO refused to this user: none
                self._next = float("inf")
                logger.warning(
                    "Redis at %s refuses INFO to this user: back-pressure is off for this "
                    "worker (HA_REDIS_MEMORY_HIGH is not applied, nor is Redis's "
                    "maxmemory-policy checked); allow the user INFO (ACL SETUSER ... +info) "
                    "to have them",
                    self.redis_url,
                )
                return
            except redis.exceptions.ResponseError as exc:  # (BUSY: a long script) this check
                logger.debug("Could not read Redis's memory at %s: %s", self.redis_url, exc)
                return
        nodes = [_memory(node) for node in _nodes(info)]
        above = [(used, most, self.config.marks(most)) for used, most in nodes]
        if all(marks is None for _, _, marks in above):
            self._next = now + MEMORY_UNBOUNDED_INTERVAL
        # a cluster's primary not read (unreachable, refusing INFO): a hold stays (it may
        # be the full one), and is looked at again in a second
        unread = any(v is None for v in info.values())
        if unread:
            self._next = now + MEMORY_CHECK_INTERVAL
        await self._judge(queue, nodes, above, unread=unread)

    async def _judge(
        self,
        queue: RedisQueue,
        nodes: list[tuple[int, int]],
        above: list[tuple[int, int, tuple[int, int] | None]],
        *,
        unread: bool = False,
    ) -> None:
        """Hold back, go on or stay as it is, from each server's memory and its marks (a
        hold stays while a server could not be read: *unread*)."""
        high = [(u, m, mk) for u, m, mk in above if mk is not None and u >= mk[0]]
        if high:
            if not self.remote.held:
                self._hold(*high[0])
            self._joined = False  # above the high mark itself: it holds back on its own
        elif not self.remote.held and (band := _in_band(above)):
            if await queue.client.exists(queue.keys.pressure):  # another worker holds back
                self._hold(*band, joined=True)
        elif self.remote.held and not unread and all(mk is None or u < mk[1] for u, _, mk in above):
            await self._go_on(queue, nodes)
        elif self._joined and not await queue.client.exists(queue.keys.pressure):
            await self._go_on(queue, nodes, alone=True)  # the workers it joined are gone
        if self.remote.held and not self._joined:
            await self._mark(queue, *(high or above)[0])

    def _hold(
        self, used: int, most: int, marks: tuple[int, int] | None, *, joined: bool = False
    ) -> None:
        """Hold back: memory is above the high mark, or (*joined*) between the marks while
        another worker of the crawl holds back (its mark in Redis): the crawl holds back as
        one until memory is below the low mark, a worker started in between included."""
        assert marks is not None
        self.remote.held = True
        self._joined = joined
        self._since_ms = 0  # Redis's time, read by the first mark (_mark)
        self.stats.inc_value("ha/backpressure/held")
        logger.warning(
            "Redis at %s uses %s of its %s (HA_REDIS_MEMORY_HIGH: %s%s): this worker leases "
            "nothing new until it falls below %s (HA_REDIS_MEMORY_LOW); the pages it holds "
            "finish and their requests are stored, nothing is lost",
            self.redis_url,
            _mb(used),
            f"maxmemory {_mb(most)}" if most else "memory",
            _mb(marks[0]),
            ", reached earlier: the crawl's other workers hold back" if joined else "",
            _mb(marks[1]),
        )

    async def _go_on(
        self, queue: RedisQueue, nodes: list[tuple[int, int]], *, alone: bool = False
    ) -> None:
        """Lease again: memory is below the low mark, or (*alone*) this worker held back
        only because others did, and their mark is gone (they left, or went on)."""
        self.remote.held = self._joined = False
        logger.info(
            "Redis at %s uses %s: %s, this worker leases again",
            self.redis_url,
            _mb(max(used for used, _ in nodes)),
            "no other worker holds back" if alone else "below HA_REDIS_MEMORY_LOW",
        )
        if not alone:
            await queue.client.delete(queue.keys.pressure)

    async def _mark(
        self, queue: RedisQueue, used: int, most: int, marks: tuple[int, int] | None
    ) -> None:
        """Mark the crawl as held back (for status and metrics); a Redis already full
        refuses the write, which costs nothing here. The mark keeps its ``since`` while it
        lives: the hold's start of the first worker that saw it, not each worker's own."""
        high, low = marks or (0, 0)
        key = queue.keys.pressure
        try:
            if not self._since_ms:  # (every stored time is Redis's: workers' clocks differ)
                self._since_ms = await server_ms(queue.client)
            raw = await queue.client.get(key)
            since = _since(raw)
            doc = {"used": used, "max": most, "high": high, "low": low}
            doc["since"] = since or self._since_ms
            # (the mark gone meanwhile, by a worker below the low mark: not made again;
            # made by another worker meanwhile: its since stays; garbage: written over)
            new = {"xx": True} if since else {"nx": raw is None}
            await queue.client.set(key, json.dumps(doc), px=PRESSURE_TTL_MS, **new)
        except redis.exceptions.ResponseError:
            pass


def _nodes(info: Any) -> list[dict[str, Any]]:
    """INFO memory of a server, or of every node of a cluster (a dict per node)."""
    if isinstance(info, dict) and "used_memory" in info:
        return [info]
    if isinstance(info, dict):
        return [v for v in info.values() if isinstance(v, dict) and "used_memory" in v]
    return []


def _memory(info: dict[str, Any]) -> tuple[int, int]:
    return int(info.get("used_memory", 0) or 0), int(info.get("maxmemory", 0) or 0)


def _since(raw: bytes | None) -> int:
    """The ``since`` of the mark *raw* (0: no mark, or one that is not ours)."""
    try:
        since = json.loads(raw)["since"] if raw else 0
    except (ValueError, TypeError, KeyError):
        return 0
    return since if isinstance(since, int) and not isinstance(since, bool) and since > 0 else 0


def _in_band(
    above: list[tuple[int, int, tuple[int, int] | None]],
) -> tuple[int, int, tuple[int, int]] | None:
    """A server whose memory is between the low and the high mark, if any."""
    for used, most, marks in above:
        if marks is not None and marks[1] <= used < marks[0]:
            return used, most, marks
    return None


def _mb(n: int) -> str:
    return f"{n / 2**20:,.1f} MB"
