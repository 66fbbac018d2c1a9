"""What an operator does to a crawl, one function each, for every tool that offers it.

The ``scrapy-ha`` commands and the dashboard both call these, so that "retry now" or "pause"
means the same thing whichever tool was used. Times are Redis's clock.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from scrapy_ha.store.connection import server_ms
from scrapy_ha.store.wire import text

if TYPE_CHECKING:
    from scrapy_ha.keys import Keys
    from scrapy_ha.store.queue import RedisQueue

__all__ = ["cleared_crawl_note", "make_due", "pause", "resume", "server_ms"]

#: Entries changed per Redis call by a bulk action: large enough to be quick, small enough
#: not to hold Redis for long on a million-entry table.
BATCH = 500


async def cleared_crawl_note(queue: RedisQueue) -> str:
    """What a requeue into a crawl its end cleared (``SCHEDULER_PERSIST = False``) must say
    ("" for another crawl): its dupefilter went with it, so the next worker crawls what was
    requeued with its start requests (a QA run: the whole site crawled again, every item
    of the outbox stored twice, nothing said)."""
    if text(await queue.client.get(queue.keys.finish_record) or b"") != "done":
        return ""
    return (
        f"the crawl of {queue.keys.spider} finished and was cleared (SCHEDULER_PERSIST="
        "False), its dupefilter with it: the next worker crawls what was requeued together "
        'with its start requests, as a crawl made anew (docs/reference.md, "Runs")'
    )


async def make_due(queue: RedisQueue, ids: list[str]) -> int:
    """These delayed retries are due now: the next sync of any worker promotes them. A
    revisit among them is due now in ``ha:{S}:revisits`` too, in the same transaction, so
    that status, the metrics and the dashboard count it due (before, a revisit due in two
    hours made due now was still "not due in the next hour").
    Returns how many were still delayed (an id already promoted or gone is skipped)."""
    from scrapy_ha.store.shards import ShardedQueue

    now = await server_ms(queue.client)
    by: dict[Keys, list[str]] = {}  # the keys of its shard -> ids in it
    for entry_id in ids:
        if isinstance(queue, ShardedQueue):
            shard, local = queue.route(entry_id)
            if shard < len(queue.shards):
                by.setdefault(queue.shards[shard].keys, []).append(local)
        else:
            by.setdefault(queue.keys, []).append(entry_id)
    changed = 0
    for keys, key_ids in by.items():
        for start in range(0, len(key_ids), BATCH):
            mapping = dict.fromkeys(key_ids[start : start + BATCH], now)
            pipe = queue.client.pipeline(transaction=True)
            pipe.zadd(keys.delayed, mapping, xx=True, ch=True)
            pipe.zadd(keys.revisits, mapping, xx=True, lt=True)  # revisits alone
            changed += int((await pipe.execute())[0])
    return changed


async def pause(queue: RedisQueue, by: str) -> bool:
    """Set the crawl's paused key (when, and *by* whom): workers lease nothing new at their
    next sync. False when it was paused already (the first pause's time is kept)."""
    from scrapy_ha.store.sharding import shards_of

    doc = json.dumps({"at": await server_ms(queue.client), "by": by})
    # every shard leases nothing; shard 0's key says since when, for `status`
    done = [bool(await s.client.set(s.keys.paused, doc, nx=True)) for s in shards_of(queue)]
    return done[0]


async def resume(queue: RedisQueue) -> bool:
    """Delete the paused key: workers lease again at their next sync. False when the crawl
    was not paused."""
    from scrapy_ha.store.sharding import shards_of

    return bool(sum([await s.client.delete(s.keys.paused) for s in shards_of(queue)]))
