"""A worker that closes on a finished crawl while other workers' heartbeats live.

finish.lua ends a finished crawl only when no other worker is alive: the last worker to
leave ends it. A worker killed (SIGKILL, a lost machine) leaves its heartbeat live for up
to ``HA_HEARTBEAT_TTL``, and nobody renews or removes it: if the crawl finishes meanwhile,
every worker leaves it to that one, and the crawl stays uncleared for ever
(``SCHEDULER_PERSIST=False``: its next run finds every URL seen). So a worker whose finish
another heartbeat refused watches those heartbeats (:func:`outlast`). One renewed (that
worker lives, and will close on the crawl in its turn), a new one (a worker started) or
work in the crawl again: it leaves the crawl to them. One removed (its worker left, by a
finish of its own or not) or expired (killed) is dropped; once none is left, and none was
removed at the last look (a worker that left may be finishing), it tries the finish itself
(finish.lua does nothing where another worker cleared the crawl since).
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
#: The wait's bound, in ``HA_HEARTBEAT_TTL``: a heartbeat nobody renews expires within one
#: (another worker's TTL may be longer; a Redis clock set back delays it).
OUTLAST_CAP = 10


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
    step, me = config.close_timeout, config.worker_id
    async with asyncio.timeout(step):
        now, seen, busy = await _look(queue, me)
    if busy:
        return Finished(False)
    if seen:
        logger.info(
            "The crawl is finished, but %d other worker(s) have a live heartbeat: waiting for "
            "them to close or, killed, for their heartbeats to expire (up to HA_HEARTBEAT_TTL"
            "=%gs after their last renewal), then ending it",
            len(seen),
            config.heartbeat_ttl,
        )
    loop = asyncio.get_running_loop()
    until = loop.time() + OUTLAST_CAP * config.heartbeat_ttl  # a clock gone wrong
    while loop.time() < until and not stop_asked():
        await asyncio.sleep(OUTLAST_POLL)
        async with asyncio.timeout(step):
            now, live, busy = await _look(queue, me)
        if busy or live.keys() - seen.keys() or any(live.get(w, 0) > e for w, e in seen.items()):
            logger.info("The crawl is finished: another worker ends it")
            return Finished(False)
        # removed before their expiry at this look: their workers left, and may be finishing
        left = [worker for worker, expiry in seen.items() if worker not in live and expiry > now]
        seen = {worker: expiry for worker, expiry in seen.items() if worker in live}
        if not seen and not left:  # all expired: killed
            async with asyncio.timeout(step):
                ended = await queue.finish(me, keep=config.persist)
            if not ended:  # ended by another (finish.lua), a heartbeat or work since, a fence
                logger.info("The crawl is finished: another worker ends it")
            return ended
    logger.warning(
        "Stopped waiting for the heartbeats of %d other worker(s)%s: the crawl of %s stays "
        "in Redis until a worker closes on it again, or `scrapy-ha flush %s`",
        len(seen),
        " (a shutdown was asked)" if stop_asked() else "",
        queue.keys.spider,
        queue.keys.spider,
    )
    return Finished(False)


async def _look(queue: RedisQueue, me: str) -> tuple[int, dict[str, int], bool]:
    """Redis's time (ms); the other workers' live heartbeats (worker -> expiry, ms; every
    worker's is in shard 0); and whether the crawl has work again (a new run: not this
    worker's to end)."""
    counts = await queue.counts()
    first = shards_of(queue)[0]
    live = await first.client.zrange(
        first.keys.workers, counts.now_ms, "+inf", byscore=True, withscores=True
    )
    others = {  # (an expiry of `inf`, written by hand, as the latest a float holds exactly)
        _s(worker): int(min(expiry, 2**53)) for worker, expiry in live if _s(worker) != me
    }
    return counts.now_ms, others, bool(counts.active)
