"""The dead-letter queue of a sharded crawl: every shard's merged, ids as the worker sees
them (``"<shard>:<id>"`` past shard 0), for the operator's tools and the worker's archive."""

from __future__ import annotations

__all__ = ["ShardedDeadLetters", "dead_letters"]

from contextlib import aclosing
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from scrapy_ha.deadletters.dlq import SCAN_BATCH, DeadEntry, DeadLetterQueue
from scrapy_ha.deadletters.stream import Selection, merged
from scrapy_ha.store.shards import ShardedQueue

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator

    from scrapy_ha.keys import Keys
    from scrapy_ha.store.queue import RedisQueue


async def _said_by_the_whole(client: Any, keys: Keys) -> None:
    """(A shard's purge or requeue: the merged queue says the crawl's shrink once, after
    every shard's, counting them all: see :func:`queue_shrunk`.)"""


async def _lifted_by_the_whole(client: Any, keys: Keys) -> int:
    """(A shard's requeue: the merged queue lifts the failed logins once, in shard 0's
    cookies, the crawl's.)"""
    return 0


class _Shard(DeadLetterQueue):
    shrunk = staticmethod(_said_by_the_whole)
    lift = staticmethod(_lifted_by_the_whole)


class ShardedDeadLetters(DeadLetterQueue):
    """The dead-letter queue of a sharded crawl: every shard's, merged oldest first, ids as
    the worker sees them (``"<shard>:<id>"`` for shards 1 and up)."""

    def __init__(self, queue: ShardedQueue) -> None:
        super().__init__(queue)
        self.sharded = queue
        self.parts: list[DeadLetterQueue] = [_Shard(shard) for shard in queue.shards]

    def _outside(self, shard: int, entry: DeadEntry) -> DeadEntry:
        return replace(entry, id=self.sharded.outside(shard, entry.id))

    async def count(self, *, since_ms: int | None = None, until_ms: int | None = None) -> int:
        return sum([await p.count(since_ms=since_ms, until_ms=until_ms) for p in self.parts])

    def batches(
        self, selection: Selection, *, requests: bool = True
    ) -> AsyncGenerator[list[DeadEntry]]:
        """As :meth:`DeadLetterQueue.batches`, across the shards, merged oldest first:
        each shard gives its first *offset* + *limit* matches, the merge keeps the page."""
        return merged(self.parts, self._outside, selection, requests=requests, batch=SCAN_BATCH)

    async def scan(
        self, *, since_ms: int | None = None, until_ms: int | None = None, skip: int = 0
    ) -> AsyncIterator[DeadEntry]:
        sel = Selection(since_ms=since_ms, until_ms=until_ms, offset=skip)
        async with aclosing(self.batches(sel)) as batches:
            async for batch in batches:
                for entry in batch:
                    yield entry

    async def get(self, entry_id: str) -> DeadEntry | None:
        shard, local = self.sharded.route(entry_id)
        if shard >= len(self.parts):
            return None
        entry = await self.parts[shard].get(local)
        return None if entry is None else self._outside(shard, entry)

    def _by_shard(self, ids: list[str]) -> dict[int, list[str]]:
        """*ids* by shard; an id of a shard the crawl does not have is left out (not found,
        as an id no shard holds)."""
        by: dict[int, list[str]] = {}
        for entry_id in ids:
            shard, local = self.sharded.route(entry_id)
            if shard < len(self.parts):
                by.setdefault(shard, []).append(local)
        return by

    async def requeue(self, ids: list[str]) -> int:
        requeued, self.without_request = 0, []
        for shard, local in sorted(self._by_shard(ids).items()):
            part = self.parts[shard]
            requeued += await part.requeue(local)
            self.without_request += [self.sharded.outside(shard, i) for i in part.without_request]
        await self.shrunk(self.client, self.keys)  # (shard 0's marker, every shard counted)
        self.logins_lifted = await self.lift(self.client, self.keys) if requeued else 0
        return requeued

    async def purge(self, ids: list[str]) -> int:
        deleted = self.kept_unarchived = 0
        for shard, local in sorted(self._by_shard(ids).items()):
            deleted += await self.parts[shard].purge(local)
            self.kept_unarchived += self.parts[shard].kept_unarchived
        await self.shrunk(self.client, self.keys)  # (shard 0's marker, every shard counted)
        return deleted


def dead_letters(queue: RedisQueue) -> DeadLetterQueue:
    """The dead-letter queue of the crawl of *queue*, every shard of it."""
    if isinstance(queue, ShardedQueue):
        return ShardedDeadLetters(queue)
    return DeadLetterQueue(queue)
