"""A worker that closes on a finished crawl while other workers' heartbeats live.

finish.lua ends a finished crawl only when no other worker is alive: the last worker to
leave ends it. A worker killed (SIGKILL, a lost machine) leaves its heartbeat live for up
to ``HA_HEARTBEAT_TTL``, and nobody renews or removes it: if the crawl finishes meanwhile,
every worker leaves it to that one, and the crawl stays uncleared for ever
(``SCHEDULER_PERSIST=False``: its next run finds every URL seen). So a worker whose finish
another heartbeat refused watches those heartbeats (:func:`outlast`): once all of them
expired it ends the crawl itself; as soon as one of them is renewed (that worker is alive
and will close on the crawl in its turn), removed early (it left: its own finish, or its own
wait, takes over) or a new heartbeat appears (a new run), it leaves the crawl to them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import redis.exceptions

from scrapy_ha.store.connection import REDIS_DOWN_ERRORS, error_text
from scrapy_ha.store.sharding import shards_of
from scrapy_ha.store.wire import Finished, _s

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy_ha.config.scheduler import SchedulerConfig
    from scrapy_ha.store.queue import RedisQueue

__all__ = ["OUTLAST_POLL", "outlast"]

logger = logging.getLogger(__name__)

#: Seconds between two looks at the heartbeats that hold a finish.
OUTLAST_POLL = 1.0


async def outlast(
    queue: RedisQueue, config: SchedulerConfig, stop_asked: Callable[[], bool]
) -> Finished:
    """End the finished crawl once the heartbeats that refused its finish expired (see the
    module), or leave it to their workers; each call to Redis bounded by
    ``HA_CLOSE_TIMEOUT``, a Redis that fails one said in a WARNING. *stop_asked*: a
    shutdown was asked meanwhile (a second Ctrl-C would kill the worker): stop waiting."""
    spider = queue.keys.spider
    try:
        return await _outlast(queue, config, stop_asked)
    except (TimeoutError, *REDIS_DOWN_ERRORS, redis.exceptions.RedisError) as exc:
        reason = error_text(exc)
    logger.warning(
        "Could not end the finished crawl of %s (%s): its working keys stay in Redis until "
        "a worker closes on it again, or `scrapy-ha flush %s`",
        spider,
        reason,
        spider,
    )
    return Finished(False)


async def _outlast(
    queue: RedisQueue, config: SchedulerConfig, stop_asked: Callable[[], bool]
) -> Finished:
    step = config.close_timeout
    async with asyncio.timeout(step):
        now, seen, active = await _look(queue)
    if active:
        return Finished(False)
    if not seen:  # the heartbeat that refused the finish expired since
        async with asyncio.timeout(step):
            return await queue.finish(config.worker_id, keep=config.persist)
    wait = min(max(seen.values()) - now, int(config.heartbeat_ttl * 1000)) / 1000
    logger.info(
        "The crawl is finished, but %d other worker(s) have a live heartbeat: waiting up to "
        "%.0f s for them to close or, killed, to expire (HA_HEARTBEAT_TTL=%gs), then ending it",
        len(seen),
        wait + OUTLAST_POLL,
        config.heartbeat_ttl,
    )
    loop = asyncio.get_running_loop()
    until = loop.time() + wait + OUTLAST_POLL
    while (left := until - loop.time()) > 0:
        if stop_asked():
            break
        await asyncio.sleep(min(OUTLAST_POLL, left))
        async with asyncio.timeout(step):
            now, live, active = await _look(queue)
        if active or _taken_over(seen, live, now):
            logger.info("The crawl is finished: another worker ends it")
            return Finished(False)
        if not live.keys() & seen.keys():  # all of them expired: killed
            async with asyncio.timeout(step):
                return await queue.finish(config.worker_id, keep=config.persist)
    logger.warning(
        "Stopped waiting for the heartbeats of %d other worker(s)%s: the crawl of %s stays "
        "in Redis until a worker closes on it again, or `scrapy-ha flush %s`",
        len(seen),
        " (a shutdown was asked)" if stop_asked() else "",
        queue.keys.spider,
        queue.keys.spider,
    )
    return Finished(False)


def _taken_over(seen: dict[str, int], live: dict[str, int], now: int) -> bool:
    """A heartbeat of *seen* was renewed (its worker lives) or removed before its expiry
    (its worker left), or a new one is live (a worker started): that worker ends the crawl."""
    if live.keys() - seen.keys():
        return True
    return any(
        live[worker] > expiry if worker in live else expiry > now for worker, expiry in seen.items()
    )


async def _look(queue: RedisQueue) -> tuple[int, dict[str, int], int]:
    """Redis's time (ms), the live heartbeats (worker -> expiry, ms; every worker's is in
    shard 0), and what the crawl holds pending, leased or delayed."""
    counts = await queue.counts()
    first = shards_of(queue)[0]
    live = await first.client.zrange(
        first.keys.workers, counts.now_ms, "+inf", byscore=True, withscores=True
    )
    return counts.now_ms, {_s(worker): int(expiry) for worker, expiry in live}, counts.active
