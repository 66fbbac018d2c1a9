"""The worker side of the SQL archive (``HA_DLQ_ARCHIVE_URL``): each dead letter a worker
makes is copied into the archive (:mod:`.archive`) in the background, one batch at a time in
a daemon thread, so that a database that is down or frozen costs no request and never holds
up the worker's exit: what is not copied is said, counted, and left in Redis for
``scrapy-ha dlq archive``."""

from __future__ import annotations

__all__ = ["CLOSE_TIMEOUT", "Archiver"]

import asyncio
import logging
import time
from typing import TYPE_CHECKING

import redis

from scrapy_ha.config import validate as check
from scrapy_ha.deadletters._threads import in_daemon_thread
from scrapy_ha.deadletters.archive import DEFAULT_TABLE, Archive
from scrapy_ha.deadletters.dlq import SCAN_BATCH
from scrapy_ha.deadletters.marks import declare, mark_crawl
from scrapy_ha.deadletters.sharded import dead_letters
from scrapy_ha.store.sharding import shards_of

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings
    from scrapy.statscollectors import StatsCollector

    from scrapy_ha.store.queue import RedisQueue

logger = logging.getLogger(__name__)

#: Seconds a closing worker waits for the copies still under way (then the CLI catches up).
CLOSE_TIMEOUT = 30.0
#: Seconds between two WARNINGs of batches that could not be copied: a database that is
#: down fails every batch, and a busy crawl makes a batch of one dead letter at a time
#: (those between are counted in the next WARNING, or at close).
WARN_EVERY = 60.0


class Archiver:
    """Copies a worker's dead letters into the archive as it makes them, one batch at a time
    in a thread of its own; a failure is logged and counted, never raised."""

    def __init__(self, archive: Archive, stats: StatsCollector) -> None:
        self.archive = archive
        self.stats = stats
        self._declared = False
        self._created = False
        self._ids: list[str] = []
        self._copying = 0  # dead letters of the batch under way
        self._spider = ""
        self._task: asyncio.Task[None] | None = None
        self._warned_at: float | None = None  # the last batch's WARNING (monotonic)
        self._unsaid = 0  # dead letters of the failed batches not said since

    @classmethod
    def from_settings(cls, settings: BaseSettings, stats: StatsCollector) -> Archiver | None:
        """The archiver *settings* ask for (``HA_DLQ_ARCHIVE_URL``), or None."""
        url = check.text(settings, "HA_DLQ_ARCHIVE_URL", "")
        if not url:
            return None
        table = check.text(settings, "HA_DLQ_ARCHIVE_TABLE", DEFAULT_TABLE)
        return cls(Archive(url, table), stats)

    async def ready(self, queue: RedisQueue) -> None:
        """Declare the archive in Redis once, before this worker's first dead letter (Redis
        errors are raised: the caller keeps the operation and comes back)."""
        if not self._declared:
            for shard in shards_of(queue):  # (each shard's retention and purge keep for it)
                await declare(shard.client, shard.keys, self.archive)
            self._declared = True
            logger.info(
                "Dead letters of %s are archived in %s (HA_DLQ_ARCHIVE_URL)",
                queue.keys.spider,
                self.archive.display_url,
            )

    def submit(self, queue: RedisQueue, ids: list[str]) -> None:
        """Archive the dead letters *ids* soon (in the background)."""
        self._spider = queue.keys.spider
        self._ids += ids
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain(queue))

    async def _drain(self, queue: RedisQueue) -> None:
        while self._ids:
            ids, self._ids = self._ids[:SCAN_BATCH], self._ids[SCAN_BATCH:]
            self._copying = len(ids)
            try:
                await self._copy(queue, ids)
            except Exception as exc:
                self.stats.inc_value("ha/archive/errors")
                self._failed(len(ids), _why(exc))
            self._copying = 0

    def _failed(self, n: int, why: str) -> None:
        """Say a batch of *n* that could not be copied, unless one was said less than
        :data:`WARN_EVERY` ago (counted then, and said with the next one or at close)."""
        now = time.monotonic()
        if self._warned_at is not None and now - self._warned_at < WARN_EVERY:
            self._unsaid += n
            return
        self._warned_at = now
        spider = self._spider
        more = self._said_since()
        logger.warning(
            "Could not archive %d dead letter(s) of %s in %s: %s (they stay in Redis, kept "
            "by retention: `scrapy-ha dlq archive %s` copies them)%s",
            n,
            spider,
            self.archive.display_url,
            why,
            spider,
            more,
        )

    def _said_since(self) -> str:
        """The failed copies held back since the last WARNING, said (and forgotten)."""
        n, self._unsaid = self._unsaid, 0
        if not n:
            return ""
        return f"; {n} more could not be archived since the last such WARNING"

    async def _copy(self, queue: RedisQueue, ids: list[str]) -> None:
        dlq = dead_letters(queue)  # (a sharded crawl's ids name their shard)
        entries = [e for e in [await dlq.get(i) for i in ids] if e is not None]
        if not entries:
            return
        if not self._created:
            await in_daemon_thread(self.archive.create)
            self._created = True
        written = await in_daemon_thread(self.archive.write, queue.keys.spider, entries)
        await mark_crawl(dlq, self.archive.sink, written.entries)
        self.stats.inc_value("ha/archive/archived", written.new)  # each record once
        for entry_id, error in written.errors:
            self.stats.inc_value("ha/archive/errors")
            logger.warning(
                "Could not archive dead letter %s of %s in %s: %s (it stays in Redis)",
                entry_id,
                queue.keys.spider,
                self.archive.display_url,
                error,
            )

    async def close(self) -> None:
        """Wait (a bounded time) for the copies under way, then let the database go; what
        is not copied by then is said, and left to ``scrapy-ha dlq archive``."""
        if self._task is not None and not self._task.done():
            await asyncio.wait([self._task], timeout=CLOSE_TIMEOUT)
            if not self._task.done():
                self._task.cancel()
                self._given_up(len(self._ids) + self._copying + self._unsaid)
                return  # the database holds a thread: closing it would wait for that too
        if self._unsaid:
            spider = self._spider
            logger.warning(
                "%d more dead letter(s) of %s could not be archived in %s since the last "
                "WARNING (they stay in Redis, kept by retention: `scrapy-ha dlq archive %s` "
                "copies them)",
                self._unsaid,
                spider,
                self.archive.display_url,
                spider,
            )
            self._unsaid = 0
        await asyncio.wait([in_daemon_thread(self.archive.close)], timeout=CLOSE_TIMEOUT)

    def _given_up(self, left: int) -> None:
        spider = self._spider
        logger.warning(
            "%d dead letter(s) of %s were not archived at close: %s did not answer within "
            "%gs (they stay in Redis, kept by retention: `scrapy-ha dlq archive %s` "
            "copies them)",
            left,
            spider,
            self.archive.display_url,
            CLOSE_TIMEOUT,
            spider,
        )


def _why(exc: Exception) -> str:
    """Why a batch was not copied: a Redis error is said as Redis's (the batch is read from
    Redis and marked there), not the archive's."""
    why = f"{type(exc).__name__}: {exc}"
    return f"Redis failed, not the archive ({why})" if isinstance(exc, redis.RedisError) else why
