"""A single set beside the crawl's dupefilter: a worker of a version before the buckets, the
Bloom filter and the time slices (2026-12-01 and earlier) that joins a crawl keeping one of
them writes its own one set ``ha:{S}:dupefilter`` beside it, and does not see the URLs the
crawl's other workers saw (some are crawled twice; none is lost). A worker of this version
says so in a WARNING when it starts, and once while it runs; it is not refused for it."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy_ha.store.shards import ShardedQueue

if TYPE_CHECKING:
    from scrapy_ha.keys import Keys
    from scrapy_ha.store.queue import RedisQueue

logger = logging.getLogger(__name__)

__all__ = ["say_single_set", "single_set_beside"]

#: What a crawl keeps instead of the single set (the key's name in :class:`Keys`), as said,
#: and what the workers of this version see of the set (the time slices read it, until
#: their next slice takes it over; the buckets and the Bloom filter do not).
KEPT = {
    "buckets": ("in buckets", "the two versions do not see each other's URLs"),
    "bloom": ("in a Bloom filter", "the two versions do not see each other's URLs"),
    "aged": ("in time slices", "the earlier version does not see the URLs of this one"),
}


def say_single_set(keys: Keys, kept: str = "buckets") -> None:
    """A WARNING: the crawl keeps its dupefilter *kept* (a key of :data:`KEPT`) and a
    single set too (see :func:`single_set_beside`)."""
    where, seen = KEPT[kept]
    logger.warning(
        "The crawl of %s has its dupefilter %s (%s) and a single set (%s) too: a worker of a "
        "version before them joined it and keeps the set, so %s (some are crawled twice); "
        "run every worker of this crawl on one version",
        keys.spider,
        where,
        getattr(keys, kept),
        keys.dupefilter,
        seen,
    )


async def single_set_beside(queue: RedisQueue) -> tuple[Keys, str] | None:
    """The keys of the crawl of *queue* (its first shard) and what it keeps its dupefilter
    in (a key of :data:`KEPT`) if a single set is there too, else None: one round trip
    while there is no single set."""
    shard = queue.shards[0] if isinstance(queue, ShardedQueue) else queue
    keys, client = shard.keys, shard.client
    if not await client.exists(keys.dupefilter):
        return None
    for kept in KEPT:
        if await client.exists(getattr(keys, kept)):
            return keys, kept
    return None  # a crawl made before the buckets: the set is its dupefilter
