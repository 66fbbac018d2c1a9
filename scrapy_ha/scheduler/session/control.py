"""What the operator tells a running crawl, read by each worker every
``HA_LEASE_RENEW_INTERVAL``: the ``scrapy-ha seen forget`` rules (:mod:`scrapy_ha.store.forget`),
and ``scrapy-ha stop``: a worker that joined the crawl before the stop's time closes its
spider (finish reason ``stopped``), as Ctrl-C does (what it holds goes back to Redis); a
worker that joins later runs.

Also the background task's deaths: a task that dies on an error it did not catch (a bug) is
started again, until :data:`TASK_RESTARTS` deaths within :data:`TASK_RESTART_WINDOW`
seconds close the spider.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import redis.asyncio

from scrapy_ha.scheduler import engine
from scrapy_ha.store.connection import server_ms, time_ms
from scrapy_ha.store.forget import rules_of

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from scrapy_ha.scheduler.admission import Admission
    from scrapy_ha.store.queue import RedisQueue

logger = logging.getLogger(__name__)

#: The finish reason of a spider closed by ``scrapy-ha stop``.
STOPPED = "stopped"

__all__ = ["STOPPED", "TASK_RESTARTS", "TASK_RESTART_WINDOW", "Control", "Restarts"]

#: Deaths of the background task within TASK_RESTART_WINDOW seconds that close the spider;
#: fewer start it again.
TASK_RESTARTS = 3
TASK_RESTART_WINDOW = 60.0


#: The field of the crawl's ``run`` hash that says when a worker last resumed a stopped
#: crawl (server ms).
RESUMED = "resumed"


class Control:
    """Reads the operator's instructions for the crawl at most every *interval* seconds."""

    def __init__(self, crawler: Crawler, admission: Admission, interval: float) -> None:
        self.crawler = crawler
        self.admission = admission
        self.interval = interval  # HA_LEASE_RENEW_INTERVAL
        self._last = -interval
        self.joined_ms = 0  # when this worker joined, by the server's clock
        self.stopped = False
        #: when this worker resumed a stopped crawl, until the run hash says so (written in
        #: the next poll's trip); and whether it does
        self._resumed_at = 0
        self._resume_written = False
        self._garbage_said = False  # the stop key's garbage, said once

    async def poll(
        self, queue: RedisQueue, *, now: float | None = None, paused: bool = False
    ) -> bool:
        """Read them if they are due (always with *now* None: at connect); with *paused*,
        in the same round trip, whether an operator paused the crawl (returned; else
        False)."""
        if now is not None and now - self._last < self.interval:
            return False
        self._last = time.monotonic() if now is None else now
        client, joining = queue.client, not self.joined_ms
        if joining and isinstance(client, redis.asyncio.RedisCluster):  # no TIME in its pipelines
            self.joined_ms = await server_ms(client)
            joining = False
        pipe = client.pipeline(transaction=False)  # one round trip
        if joining:  # the server's clock, read before the stop flag (a pipeline keeps order)
            pipe.time()
        pipe.hgetall(queue.keys.forget)
        pipe.get(queue.keys.stop)
        if paused:
            pipe.exists(queue.keys.paused)
        resumed = self._resumed_at  # (in this trip: none more before the first request)
        if resumed:
            pipe.hset(queue.keys.run, RESUMED, resumed)
        replies = await pipe.execute()
        if joining:
            self.joined_ms = time_ms(replies.pop(0))
        if resumed:
            replies.pop()
            self._resumed_at, self._resume_written = 0, True
        rules, raw_stop, *held = replies
        stop = self._stop_time(raw_stop, queue)
        fresh = not (self._resumed_at or self._resume_written)
        if fresh and stop is not None and stop <= self.joined_ms:
            # a worker started after `scrapy-ha stop` resumes the crawl: the next poll says
            # so, for the items consumers whose --exit-idle waits for a stopped crawl's end
            self._resumed_at = self.joined_ms
        if stop is not None and stop > self.joined_ms and not self.stopped:
            self.stopped = True
            logger.info("Stopping: `scrapy-ha stop` asked at %s", _local_time(stop))
            engine.close_spider(self.crawler, STOPPED)
        # after the stop: a rule that cannot be read must not keep a stop unseen
        self.admission.set_rules(rules_of(rules))
        return bool(held and held[0])

    def _stop_time(self, raw: bytes | None, queue: RedisQueue) -> int | None:
        """The time ``scrapy-ha stop`` wrote (server ms), None when none: garbage there
        (written by hand) is no stop, said once (it failed the start, blamed on REDIS_URL)."""
        if raw is None:
            return None
        try:
            return int(raw)
        except ValueError:
            if not self._garbage_said:
                self._garbage_said = True
                logger.warning(
                    "%s holds %r, no time `scrapy-ha stop` writes: no stop is read from it",
                    queue.keys.stop,
                    raw[:100],
                )
            return None


def _local_time(ms: int) -> str:
    """A Redis time (ms) as the operator's tools print it (``2026-11-30 17:05:12``, local
    time; scrapy_ha.ops.display's format, a layer above): the log said the raw number."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


class Restarts:
    """When the background task died (see the module's docstring)."""

    def __init__(self) -> None:
        self._at: list[float] = []

    def died(self) -> int:
        """Count a death now; returns the deaths within the window, this one included."""
        now = time.monotonic()
        self._at = [t for t in self._at if now - t < TASK_RESTART_WINDOW] + [now]
        return len(self._at)
