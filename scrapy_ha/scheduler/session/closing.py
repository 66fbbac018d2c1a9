"""How long a closing worker waits for Redis: ``HA_CLOSE_TIMEOUT`` for a Redis that makes
no progress, in all, once the spider is closing.

The engine first waits for the requests in progress; those handed out before Redis had
them wait for its verdict, which a Redis that does not answer never gives, so
``HA_CLOSE_TIMEOUT`` after the close began they go on. The hand-back (the background
task's last round, the final flush) gets what is left of the budget, counted from the
later of the close's start and the last round Redis answered; then the keeper's thread
and the connections get :data:`TEARDOWN_TIMEOUT`. What Redis did not take back is not lost:
the leases expire and another worker reclaims them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

import redis.exceptions

from scrapy_ha.scheduler.session.connect import say_set_aside
from scrapy_ha.scheduler.session.outlast import outlast
from scrapy_ha.store.frontier import relink_queues
from scrapy_ha.store.runs import end_run
from scrapy_ha.store.sharding import shards_of

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.crawler import Crawler

    from scrapy_ha.config.scheduler import SchedulerConfig
    from scrapy_ha.scheduler.session.ends import Ends
    from scrapy_ha.scheduler.session.renewal import Renewals
    from scrapy_ha.store.queue import RedisQueue

logger = logging.getLogger(__name__)

#: Seconds the keeper's thread and the connections get once the hand-back at close is over
#: or given up: a Redis that does not answer is not waited for, the exit closes them.
TEARDOWN_TIMEOUT = 1.0


class CloseClock:
    """The close's budget (see the module): when the background task last made progress,
    when the spider's close began, and the timer that then lets the gated downloads go."""

    def __init__(self, close_timeout: float) -> None:
        self.close_timeout = close_timeout
        self._said = f"HA_CLOSE_TIMEOUT={close_timeout:g}s"
        self._progress_at = 0.0
        self._closing_at: float | None = None
        self._verdicts_due: asyncio.TimerHandle | None = None
        #: called as the hand-back starts (:meth:`budget`): the start is over by then
        self.at_hand_back: list[Callable[[], None]] = []

    def hurry(self, close_timeout: float) -> None:
        """A stop came before the crawl started (nothing leased yet): the close waits for
        Redis *close_timeout* seconds at most."""
        if close_timeout < self.close_timeout:
            self.close_timeout = close_timeout
            self._said = f"{close_timeout:g} s (stopped before the crawl started)"

    def progress(self) -> None:
        """A round ended well (or the session started)."""
        self._progress_at = asyncio.get_running_loop().time()

    def closing(self, open_gate: Callable[[], None]) -> None:
        """The engine began closing the spider: *open_gate* runs ``HA_CLOSE_TIMEOUT``
        later, unless the hand-back starts first (:meth:`budget`)."""
        if self._closing_at is not None:
            return
        loop = asyncio.get_running_loop()
        self._closing_at = loop.time()
        self._verdicts_due = loop.call_later(self.close_timeout, open_gate)

    def budget(self) -> float:
        """Seconds left for the hand-back (it starts now: the gate's timer is cancelled,
        nothing waits for a verdict any more)."""
        if self._verdicts_due is not None:
            self._verdicts_due.cancel()
        for call in self.at_hand_back:
            call()
        now = asyncio.get_running_loop().time()
        since = max(self._progress_at, now if self._closing_at is None else self._closing_at)
        return max(0.0, since + self.close_timeout - now)

    @staticmethod
    def left(bound: asyncio.Timeout | None) -> float | None:
        """Seconds left of the hand-back's *bound* (None: no bound)."""
        when = None if bound is None else bound.when()
        return None if when is None else max(0.0, when - asyncio.get_running_loop().time())

    def silence(self) -> str:
        """Why the hand-back was given up when its budget ran out."""
        return f"Redis made no progress for {self._said}"


def not_handed_back(held: int, redis_url: str, why: str, config: SchedulerConfig) -> None:
    """Say that the hand-back was given up, and *why* (never an empty reason): an ERROR
    if *held* leases wait to be reclaimed, else a WARNING (a QA run's ``HA_CLOSE_TIMEOUT``
    of 1e-9 s was told of "0 lease(s)" to reclaim)."""
    if not held:
        logger.warning(
            "Gave up the close with Redis at %s (%s): this worker held no lease, so nothing "
            "waits to be reclaimed; its heartbeat lapses after HA_HEARTBEAT_TTL=%gs",
            redis_url,
            why,
            config.heartbeat_ttl,
        )
        return
    logger.error(
        "Could not hand back %d lease(s) to Redis at %s at close (%s): they will be "
        "reclaimed by another worker after HA_LEASE_TIME=%gs",
        held,
        redis_url,
        why,
        config.lease_time,
    )


async def let_go(renewals: Renewals, ends: Ends, queue: RedisQueue | None) -> None:
    """Stop the keeper, let archive copies and alerts under way end (each bounded), close
    the connection: a Redis that does not answer is not waited for."""
    await renewals.stop_keeper(TEARDOWN_TIMEOUT)
    if queue is None:
        return
    await ends.close()
    with contextlib.suppress(TimeoutError):  # the exit closes what is left
        async with asyncio.timeout(TEARDOWN_TIMEOUT):
            await queue.client.aclose()


async def end_crawl(
    queue: RedisQueue,
    config: SchedulerConfig,
    bound: asyncio.Timeout | None = None,
    stop_asked: Callable[[], bool] = lambda: False,
) -> None:
    """The crawl finished: its last worker ends it (``RedisQueue.finish``, finish.lua),
    clearing its working keys (SCHEDULER_PERSIST=False) or dropping its session cookies
    (True), waiting for the heartbeats of other workers that refuse it (:mod:`.outlast`:
    everything was handed back already, so *bound*, the close's budget, no longer holds;
    each call of the wait has a bound of its own); one INFO line says what was done."""
    persist = config.persist
    ended = await queue.finish(config.worker_id, keep=persist)
    if not ended:
        if bound is not None:
            bound.reschedule(None)
        ended = await outlast(queue, config, stop_asked)
    if ended and not persist:
        logger.info("Crawl finished: cleared its working keys (SCHEDULER_PERSIST=False)")
    elif ended.sessions:
        logger.info(
            "Crawl finished: dropped %d session cookie(s) from its shared cookie jars "
            "(SCHEDULER_PERSIST=True keeps its queue, its dupefilter and lasting cookies)",
            ended.sessions,
        )


async def wind_up(
    queue: RedisQueue,
    run: int,
    config: SchedulerConfig,
    bound: asyncio.Timeout | None = None,
    crawler: Crawler | None = None,
) -> None:
    """The crawl finished (the spider closed as ``finished``): its run ends if nothing is
    pending, leased or delayed, and the last worker ends the crawl (:func:`end_crawl`; a
    shutdown asked meanwhile, the *crawler* no longer crawling, stops its wait)."""
    if await owed_relink(queue):  # requests out of reach until now: the crawl is not over
        logger.warning(
            "Run %d of the crawl did not finish: back queues that no key named were found "
            "at its close; they wait for the next run (start a worker)",
            run,
        )
        return
    if converted := await _upgrade(queue):  # stored by an older worker since the last round
        logger.warning(
            "Run %d of the crawl did not finish: %d request(s) an older scrapy-ha stored "
            "pending were found at its close; they wait for the next run (start a worker)",
            run,
            converted,
        )
        return
    if await end_run(queue):
        logger.info("Run %d of the crawl finished", run)
    await end_crawl(queue, config, bound, lambda: crawler is not None and not crawler.crawling)


async def _upgrade(queue: RedisQueue) -> int:
    """Convert what an older worker stored pending (``RedisQueue.upgrade``); a key of
    another type there (garbage) is set aside first, as a round does: it failed the close,
    and the crawl was never ended (its next run found every URL seen)."""
    try:
        return await queue.upgrade()
    except redis.exceptions.ResponseError as exc:
        if "WRONGTYPE" not in str(exc):
            raise
        say_set_aside(await queue.set_aside_wrong_types(str(exc)))
    return await queue.upgrade()


async def owed_relink(queue: RedisQueue) -> int:
    """Do a relink of the back queues owed (:func:`~scrapy_ha.store.frontier.relink_queues`:
    a worker set ``ready`` aside and stopped before its relink) on every shard; how many
    queues it found. The spider closed as finished while they were out of its reach."""
    return sum([await relink_queues(s.client, s.keys, []) for s in shards_of(queue)])
