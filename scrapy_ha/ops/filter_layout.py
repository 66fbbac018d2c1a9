"""The layout of a Bloom filter an operator's push makes: the workers', never the defaults.

A shard gets its Bloom filter (``ha:{S}:bloom``) with its first URL, laid out by whoever
writes it (capacity, k, part: kept for the life of the crawl; a worker that comes later
adopts it). ``scrapy-ha push`` run outside the crawl's Scrapy project takes the crawl's
kind from its claim (``ha:{S}:filter``), but its own ``HA_DUPEFILTER_CAPACITY`` and
``HA_DUPEFILTER_ERROR_RATE`` are Scrapy's defaults, not the workers': a filter it made
with them (64 MB at 10 M URLs and 1e-6) would be the crawl's. So such a push makes a
shard's filter exactly as another shard's was made (the same meta fields, the same
bitmaps), and refuses to guess when no shard has one yet. Settings that name the crawl's
kind are trusted as the project's (the push runs in it).
"""

from __future__ import annotations

__all__ = ["borrow_layout", "check_room"]

import math
from typing import TYPE_CHECKING

from scrapy_ha.config.memory import ERROR_RATE_RANGE
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.store.aged import CHECKED_SLICES, AgedBloom
from scrapy_ha.store.bloom import (
    MAX_PART_BYTES,
    BloomFilter,
    BloomMetaError,
    first_layer_room,
    meta_layout,
)
from scrapy_ha.store.health import info_or_nothing, is_cluster
from scrapy_ha.store.sharding import shards_of
from scrapy_ha.store.wire import text as _s

if TYPE_CHECKING:
    from scrapy_ha.store.queue import RedisQueue

#: Settings a filter's layout comes from, as a refusal names them.
LAYOUT_SETTINGS = "HA_DUPEFILTER_CAPACITY and HA_DUPEFILTER_ERROR_RATE"
#: What a push says when the ACL refuses its user ``INFO``.
ROOM_UNCHECKED = (
    "this Redis user may not run INFO: whether Redis has room for the crawl's new Bloom "
    "filter is not checked (a worker of this user skips the check too, docs/scaling.md)"
)


async def borrow_layout(queue: RedisQueue, *, local: str, crawl: str) -> None:
    """Give each shard of *queue* whose Bloom filter does not exist yet the layout of
    another shard's filter, when the settings' dupefilter kind *local* is not the crawl's
    *crawl* (as claimed: ``bloom``, ``bloom sliced 3600``); a ConfigError naming the
    settings and the fix when no shard has a filter to take it from. Call it after
    :func:`~scrapy_ha.store.sharding.set_dupefilter` (each shard's dupefilter as stored)
    and before any write."""
    if local == crawl or not crawl.startswith("bloom"):
        return
    shards = shards_of(queue)
    pipe = queue.client.pipeline(transaction=False)
    for shard in shards:
        pipe.hgetall(shard.keys.bloom)
    metas = [{_s(k): _s(v) for k, v in raw.items()} for raw in await pipe.execute()]
    missing = [shard for shard, meta in zip(shards, metas, strict=True) if "capacity" not in meta]
    made = [meta for meta in metas if "capacity" in meta]
    if not missing:
        return
    if not made:
        raise ConfigError(_unknown(queue, crawl))
    template = made[0]  # every shard's filter made by the crawl's workers (the first's)
    for shard in missing:
        dupefilter = shard.dupefilter
        if isinstance(dupefilter, BloomFilter | AgedBloom):
            _take(dupefilter, template)


async def check_room(queue: RedisQueue) -> str | None:
    """Refuse a push that would make Bloom filters (kept for ever) whose first layers
    cannot fit in what Redis has left of its ``maxmemory``, one a shard that has none yet,
    as a worker is refused at start (:func:`~scrapy_ha.store.bloom.first_layer_room`): the
    push made them, and every worker of the crawl then failed to start on Redis's OOM
    refusal. Not on a Redis Cluster, whose ``INFO`` is per node (nor for a worker), nor
    for a user the ACL refuses ``INFO``, as a worker's start skips it: then a note saying
    so is returned. Call it after :func:`borrow_layout`, before any write."""
    if is_cluster(queue.client):
        return None
    new = [
        shard.dupefilter
        for shard in shards_of(queue)
        if isinstance(shard.dupefilter, BloomFilter)
        and not await shard.client.exists(shard.keys.bloom_part(0, 0))
    ]
    if not new:
        return None
    info = await info_or_nothing(queue.client)
    if not info:
        return ROOM_UNCHECKED
    problem = first_layer_room(new[0].capacity, new[0].error_rate, info, layers=len(new))
    if problem is not None:
        raise ConfigError(problem)
    return None


def _take(dupefilter: BloomFilter | AgedBloom, meta: dict[str, str]) -> None:
    """Lay *dupefilter* out as the filter of *meta* (its decoded meta hash) is: capacity, k
    and part, and the rate asked as the meta hash keeps it (``error``), or when it keeps
    none a rate that gives the same k."""
    capacity, k, part = meta_layout(meta)
    if part > MAX_PART_BYTES:
        raise BloomMetaError(f"part is {part}, more than a Redis string holds ({MAX_PART_BYTES})")
    scale = CHECKED_SLICES if isinstance(dupefilter, AgedBloom) else 1
    dupefilter.capacity, dupefilter.k, dupefilter.part = capacity, k, part
    dupefilter.error_rate = _asked(meta) or scale * 2.0 ** -(k - 1)  # bloom_k gives k back


def _asked(meta: dict[str, str]) -> float | None:
    """The error rate a filter was made for (``error``, the workers' setting as written),
    or None if the meta hash holds none that a worker could have written."""
    try:
        rate = float(meta.get("error", ""))
    except ValueError:
        return None
    low, high = ERROR_RATE_RANGE
    return rate if math.isfinite(rate) and low <= rate <= high else None


def _unknown(queue: RedisQueue, crawl: str) -> str:
    keys = queue.keys
    return (
        f"the crawl of {keys.spider} keeps a Bloom filter ({crawl!r}, claimed in "
        f"{keys.filter_kind}) and none of its shards has made one yet: its layout comes from "
        f"the workers' {LAYOUT_SETTINGS}, which this command does not have (it runs outside "
        f"the crawl's Scrapy project, and a filter made with other values would be the "
        f"crawl's for good): run push in the crawl's Scrapy project (its directory, or "
        f"SCRAPY_SETTINGS_MODULE), or start a worker of the crawl first (its first request "
        f"makes the filter)"
    )
