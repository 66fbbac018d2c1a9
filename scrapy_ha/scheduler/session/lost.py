"""Sync calls fenced against a Redis that lost children it had confirmed.

Redis replicates asynchronously: a primary can confirm a round that stored a page's
children and fail before its replica has them. Every sync call of a worker names the newest
child it keeps (:class:`~scrapy_ha.scheduler.outbox.Retained`); a server that lacks it refuses the
call before any write, and the worker stores the kept children again (under their own
numbers, so none is stored twice) before it sends the call again. A page is therefore never
acked on a server that lacks the children it yielded.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy_ha.scheduler.outbox import batch_end
from scrapy_ha.scheduler.session.durable import stored_again
from scrapy_ha.store.wire import ChildrenLost

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from scrapy.statscollectors import StatsCollector

    from scrapy_ha.scheduler.outbox import Outbox
    from scrapy_ha.scheduler.session.keeper import Pairs
    from scrapy_ha.store.dictionary import Dictionaries
    from scrapy_ha.store.queue import RedisQueue
    from scrapy_ha.store.wire import SyncResult

logger = logging.getLogger(__name__)

#: Times a call refused for lost children is sent again after storing them (each refusal
#: means another server lost them meanwhile: a second failover).
ATTEMPTS = 3


async def fenced_sync(
    queue: RedisQueue,
    box: Outbox,
    *,
    held: Callable[[], Pairs],
    stats: StatsCollector,
    redis_url: str,
    dictionaries: Dictionaries | None = None,
    **call: Any,
) -> SyncResult:
    """``queue.sync(**call)`` as this worker's, fenced by the newest child it keeps. A
    server that lost children may have lost the crawl's compaction dictionary too (it is
    written early, and kept children may be compacted with it): the worker writes back the
    *dictionaries* it knows first."""
    for _ in range(ATTEMPTS - 1):
        try:
            return await queue.sync(sender=box.sender(), expect=box.retained.newest(), **call)
        except ChildrenLost as lost:
            if dictionaries is not None:
                await dictionaries.restore()
            await _store_again(queue, box, lost, held(), stats, redis_url, call["lease_ms"])
    return await queue.sync(sender=box.sender(), expect=box.retained.newest(), **call)


async def _store_again(
    queue: RedisQueue,
    box: Outbox,
    lost: ChildrenLost,
    held: Pairs,
    stats: StatsCollector,
    redis_url: str,
    lease_ms: int,
) -> None:
    numbers, children = box.retained.lost(lost.have, held)
    stored_again(box.retained, lost.have)  # (kept until a snapshot of this server has them)
    added = refused = 0
    start = 0
    while start < len(children):
        end = batch_end(children, start)
        result = await queue.sync(
            enqueue=children[start:end],
            lease_ms=lease_ms,
            sender=(box.nonce, 0),
            numbers=numbers[start:end],
        )
        added, refused = added + result.added, refused + result.refused
        start = end
    stats.inc_value("ha/children_stored_again", added)
    logger.warning(
        "Redis at %s lacked %d request(s) it had stored for this worker (%s: a failover to "
        "a replica that had not received them, a restart from an older RDB snapshot or an AOF "
        "that lost its tail, or the crawl's keys were flushed): %d stored "
        "again before any ack, %d refused (the page that yielded them is not current there)",
        redis_url,
        len(children),
        lost,
        added,
        refused,
    )
