"""Which queue a crawl has: ``HA_SHARDS`` read and checked against what the crawl's first
worker wrote in Redis, and the queue made from it (one :class:`RedisQueue`, or a
:class:`~scrapy_ha.store.shards.ShardedQueue` over N shards)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy_ha.config import validate as check
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.shards import ShardedQueue

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = [
    "DEFAULT_SHARDS",
    "MAX_SHARDS",
    "check_shard_count",
    "make_queue",
    "shard_setting",
    "shards_of",
]

#: Default shard count: one hash tag, the key names of an unsharded crawl.
DEFAULT_SHARDS = 1
#: Most shards: one script call per shard per round when the crawl is idle; more shards
#: than cluster masters (times a few, for rebalancing) buy nothing.
MAX_SHARDS = 1024


def shard_setting(settings: BaseSettings) -> int:
    """``HA_SHARDS``, checked (a ConfigError names the setting and the value)."""
    shards = check.whole(settings, "HA_SHARDS", DEFAULT_SHARDS)
    if shards > MAX_SHARDS:
        raise ConfigError(f"HA_SHARDS={shards} must be {MAX_SHARDS} or fewer")
    return shards


def make_queue(
    client: Any,
    prefix: str,
    spider: str,
    shards: int,
    *,
    order: str = "fifo",
    start_order: str = "",
    worker: str = "",
    heartbeat_ms: int = 60000,
) -> RedisQueue:
    """The crawl's queue: a RedisQueue at one shard, a ShardedQueue beyond."""
    if shards == 1:
        return RedisQueue(client, Keys(prefix, spider), order=order, start_order=start_order)
    return ShardedQueue(
        client,
        Keys(prefix, spider, 0, shards),
        order=order,
        start_order=start_order,
        worker=worker,
        heartbeat_ms=heartbeat_ms,
    )


def shards_of(queue: RedisQueue) -> list[RedisQueue]:
    """The per-shard queues of *queue* (itself when it is not sharded)."""
    return list(queue.shards) if isinstance(queue, ShardedQueue) else [queue]


async def check_shard_count(queue: RedisQueue) -> None:
    """Refuse a worker whose ``HA_SHARDS`` differs from the crawl's in Redis (it would look
    for requests in the wrong shards); the first worker of a sharded crawl writes it."""
    keys = queue.keys
    wanted = keys.shards
    stored = await queue.client.get(keys.shard_count)
    if stored is None:
        unsharded = RedisQueue(queue.client, Keys(keys.prefix, keys.spider))
        if wanted > 1 and await unsharded.exists():
            raise ConfigError(
                f"HA_SHARDS={wanted} but the crawl of {keys.spider} is in Redis unsharded "
                f"(HA_SHARDS=1): run it with HA_SHARDS=1, or `scrapy-ha flush {keys.spider}` "
                "first to start it again sharded"
            )
        if wanted > 1:
            await queue.client.set(keys.shard_count, wanted, nx=True)
            stored = await queue.client.get(keys.shard_count)
        else:
            return
    have = int(stored)
    if have != wanted:
        raise ConfigError(
            f"HA_SHARDS={wanted} but the crawl of {keys.spider} is in Redis with "
            f"HA_SHARDS={have} (key {keys.shard_count}): run it with HA_SHARDS={have}, or "
            f"`scrapy-ha flush {keys.spider} --shards {have}` first to start it again"
        )
