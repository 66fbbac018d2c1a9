"""The dead letters a worker archives and alerts for, named as the crawl's tools name them:
the entries a script set aside as corrupt (its reply says how many, not which), and the id
of one this worker dead-lettered (``"<shard>:<id>"`` past shard 0 of a sharded crawl)."""

from __future__ import annotations

__all__ = ["NEWEST_SLACK", "crawl_id", "set_aside"]

from typing import TYPE_CHECKING

from scrapy_ha.deadletters.dlq import info_class
from scrapy_ha.store.shard_sync import outside
from scrapy_ha.store.sharding import shards_of
from scrapy_ha.store.shards import ShardedQueue
from scrapy_ha.store.wire import text

if TYPE_CHECKING:
    from scrapy_ha.store.queue import RedisQueue

#: Dead letters read past the number a reclaim set aside to find those it set aside (its
#: reply has no time): room for what other workers dead-lettered in the round trip since.
NEWEST_SLACK = 100


def crawl_id(queue: RedisQueue, entry_id: str) -> str:
    """*entry_id* (as the worker holds it) as ``dlq list`` names it. Ask before the entry
    ends: a sharded queue forgets the shard of an entry this worker made once it ended."""
    return outside(*queue.route(entry_id)) if isinstance(queue, ShardedQueue) else entry_id


async def set_aside(queue: RedisQueue, now_ms: int | None, newest: int) -> list[str]:
    """The dead letters of class corrupt a script set aside: found by their dead-letter
    time, the script's *now_ms* when its reply has it, else among the *newest* of each shard
    (another worker's among them is archived a little early: the copy is the same)."""
    found = []
    for shard, part in enumerate(shards_of(queue)):
        client, keys = part.client, part.keys
        if now_ms is not None:
            ids = await client.zrangebyscore(keys.dead, now_ms, now_ms)
        else:
            ids = await client.zrevrange(keys.dead, 0, newest + NEWEST_SLACK - 1)
        ids = list(map(text, ids))
        infos = await client.hmget(keys.dead_info, ids) if ids else []
        corrupt = [i for i, info in zip(ids, infos, strict=True) if info_class(info) == "corrupt"]
        found += [outside(shard, i) for i in corrupt]
    return found
