"""A sharded crawl as the operator's tools read it: the queue of a crawl named on the
command line (sharded as the crawl in Redis is), the commands that cannot read a sharded
crawl as a whole yet, and the dead-letter queue of every shard merged. The workers' side,
placement and the rounds, is :mod:`scrapy_ha.store.shards`."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from scrapy_ha.config.validate import ConfigError
from scrapy_ha.deadletters.dlq import DeadEntry, DeadLetterQueue
from scrapy_ha.keys import Keys
from scrapy_ha.ops.unreadable import read_layout_keys
from scrapy_ha.store.sharding import DEFAULT_SHARDS, make_queue, read_layout
from scrapy_ha.store.shards import ShardedQueue

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from scrapy_ha.store.queue import RedisQueue

__all__ = ["ShardedDeadLetters", "crawl_queue", "dead_letters", "refuse_unaware"]


async def crawl_queue(
    client: Any, prefix: str, spider: str, given: int | None, *, projects: bool = False
) -> RedisQueue:
    """The queue of a crawl for an operator's tool: sharded as the crawl in Redis is (its
    stored shard count), else as *given* (``--shards`` or, *projects*, the project's
    ``HA_SHARDS``; None: not given).
    A count given that differs from the crawl's is refused, and a stored count scrapy-ha
    does not write is a CrawlUnreadable naming the key, as in the listings: read as one
    shard, a command would act on shard 0 alone (``flush`` would leave the others)."""
    # what to give instead: a count given on the command line may be left out, not the
    # project's own (a QA run: "or none" was said where the project's HA_SHARDS applied)
    instead = (
        f"(the project's settings give HA_SHARDS={given}: --shards overrides them)"
        if projects
        else "(or none: the crawl's own count is read from Redis)"
    )
    stored = await client.get(Keys(prefix, spider).shard_count)
    read_layout_keys(prefix, spider, stored)  # (raises for a layout it cannot read)
    if stored is None and given is not None and given > 1:
        unsharded = make_queue(client, prefix, spider, DEFAULT_SHARDS)
        if await unsharded.exists():  # (a QA run: "no such crawl", and `pause --create`
            raise ConfigError(  # paused shards no worker reads, saying the crawl was)
                f"HA_SHARDS={given} but the crawl of {spider} is in Redis unsharded "
                f"(HA_SHARDS=1): give --shards 1 {instead}"
            )
    shards, span = read_layout(stored) if stored is not None else (given or DEFAULT_SHARDS, 0)
    if given is not None and given != shards:
        raise ConfigError(
            f"HA_SHARDS={given} but the crawl of {spider} is in Redis with HA_SHARDS={shards}: "
            f"give --shards {shards} {instead}"
        )
    return make_queue(client, prefix, spider, shards, span=span)


#: Operator commands that read one shard's keys alone: refused on a sharded crawl rather
#: than showing part of it as if it were the whole.
SHARD_UNAWARE = frozenset(
    {
        "dlq_archive",
    }
)


def refuse_unaware(queue: RedisQueue, command: str, words: str) -> None:
    """A ConfigError when *command* cannot read a sharded crawl as a whole yet."""
    if isinstance(queue, ShardedQueue) and command in SHARD_UNAWARE:
        raise ConfigError(
            f"`scrapy-ha {words}` does not read sharded crawls yet: {queue.keys.spider} has "
            f"HA_SHARDS={len(queue.shards)} and it would show one shard as the whole crawl"
        )


class ShardedDeadLetters(DeadLetterQueue):
    """The dead-letter queue of a sharded crawl: every shard's, merged oldest first, ids as
    the worker sees them (``"<shard>:<id>"`` for shards 1 and up)."""

    def __init__(self, queue: ShardedQueue) -> None:
        super().__init__(queue)
        self.sharded = queue
        self.parts = [DeadLetterQueue(shard) for shard in queue.shards]

    def _outside(self, shard: int, entry: DeadEntry) -> DeadEntry:
        return replace(entry, id=self.sharded.outside(shard, entry.id))

    async def count(self, *, since_ms: int | None = None, until_ms: int | None = None) -> int:
        return sum([await p.count(since_ms=since_ms, until_ms=until_ms) for p in self.parts])

    async def entries(
        self,
        *,
        failure_class: str | None = None,
        domain: str | None = None,
        reason: str | None = None,
        status: int | None = None,
        since_ms: int | None = None,
        until_ms: int | None = None,
        offset: int = 0,
        limit: int | None = None,
        cls: str | None = None,
    ) -> list[DeadEntry]:
        """As :meth:`DeadLetterQueue.entries`, across the shards: each shard gives its
        first *offset* + *limit* matches, the merge keeps the page asked for."""
        found: list[DeadEntry] = []
        for shard, part in enumerate(self.parts):
            found += [
                self._outside(shard, e)
                for e in await part.entries(
                    failure_class=failure_class or cls,
                    domain=domain,
                    reason=reason,
                    status=status,
                    since_ms=since_ms,
                    until_ms=until_ms,
                    limit=None if limit is None else offset + limit,
                )
            ]
        found.sort(key=lambda e: e.dead_at)
        return found[offset:] if limit is None else found[offset : offset + limit]

    async def scan(
        self, *, since_ms: int | None = None, until_ms: int | None = None, skip: int = 0
    ) -> AsyncIterator[DeadEntry]:
        for entry in await self.entries(since_ms=since_ms, until_ms=until_ms, offset=skip):
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
        return requeued

    async def purge(self, ids: list[str]) -> int:
        deleted = self.kept_unarchived = 0
        for shard, local in sorted(self._by_shard(ids).items()):
            deleted += await self.parts[shard].purge(local)
            self.kept_unarchived += self.parts[shard].kept_unarchived
        return deleted


def dead_letters(queue: RedisQueue) -> DeadLetterQueue:
    """The dead-letter queue of the crawl of *queue*, every shard of it."""
    if isinstance(queue, ShardedQueue):
        return ShardedDeadLetters(queue)
    return DeadLetterQueue(queue)
