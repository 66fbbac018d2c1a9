"""A sharded crawl as the operator's tools read it: the queue of a crawl named on the
command line (sharded as the crawl in Redis is), and the dead-letter queue of every shard
merged (:mod:`scrapy_ha.deadletters.sharded`). The workers' side, placement and the
rounds, is :mod:`scrapy_ha.store.shards`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy_ha.config.validate import ConfigError
from scrapy_ha.deadletters.sharded import ShardedDeadLetters, dead_letters
from scrapy_ha.keys import Keys
from scrapy_ha.ops.unreadable import read_layout_keys
from scrapy_ha.store.sharding import DEFAULT_SHARDS, make_queue, read_layout

if TYPE_CHECKING:
    from scrapy_ha.store.queue import RedisQueue

__all__ = ["ShardedDeadLetters", "crawl_queue", "dead_letters", "stored_order"]


async def crawl_queue(
    client: Any,
    prefix: str,
    spider: str,
    given: int | None,
    *,
    projects: bool = False,
    order: tuple[str, str] = ("fifo", ""),
) -> RedisQueue:
    """The queue of a crawl for an operator's tool: sharded as the crawl in Redis is (its
    stored shard count), else as *given* (``--shards`` or, *projects*, the project's
    ``HA_SHARDS``; None: not given); *order*: the order within a priority of its workers
    and of their start requests (``push`` places requests as a worker does).
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
    return make_queue(
        client, prefix, spider, shards, span=span, order=order[0], start_order=order[1]
    )


async def stored_order(queue: RedisQueue) -> tuple[str, str] | None:
    """The order within a priority of the crawl's workers, as their back queues hold it: the
    place of a back queue's head (lib/priority.lua place_of) is its sequence number in FIFO
    order, START_PART less it in LIFO order; None when no back queue of other requests than
    start ones is pending (a command run without the workers' settings, ``push`` outside
    their project, would otherwise take Scrapy's default, LIFO, for a FIFO crawl)."""
    from scrapy_ha.store.scripts import PRIORITY_STEP
    from scrapy_ha.store.sharding import shards_of

    start_part = PRIORITY_STEP // 2
    for shard in shards_of(queue):
        heads = await shard.client.zrange(shard.keys.ready, 0, 31, withscores=True)
        for qid, score in heads:
            name = qid.decode() if isinstance(qid, bytes) else qid
            if not name.partition(":")[0].endswith("s"):  # "0s:host": start requests
                place = int(score) % PRIORITY_STEP
                return ("lifo" if place > start_part // 2 else "fifo"), queue.start_order
    return None
