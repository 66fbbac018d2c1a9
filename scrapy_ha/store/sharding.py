"""Which queue a crawl has: ``HA_SHARDS`` read and checked against what the crawl's first
worker wrote in Redis, and the queue made from it (one :class:`RedisQueue`, or a
:class:`~scrapy_ha.store.shards.ShardedQueue` over N shards)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import redis.asyncio

from scrapy_ha.config import validate as check
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.keys import Keys
from scrapy_ha.store.aged import AgedBloom, AgedSet
from scrapy_ha.store.bloom import BloomFilter, Dupefilter, ExactSet, filter_metas
from scrapy_ha.store.bloom_state import bloom_state
from scrapy_ha.store.buckets import BucketSet, BucketState, bucket_count, bucket_state
from scrapy_ha.store.claims import claim_kind
from scrapy_ha.store.connection import server_ms, time_ms
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.shards import ShardedQueue
from scrapy_ha.store.single_set import say_single_set, single_set_beside
from scrapy_ha.store.wire import text as _s

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

    from scrapy_ha.config.memory import MemoryConfig

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_SHARDS",
    "MAX_SHARDS",
    "check_shard_count",
    "dupefilter_figures",
    "layout_keys",
    "layout_problem",
    "make_queue",
    "queue_in_redis",
    "read_layout",
    "claim_kind",
    "say_single_set",
    "set_dupefilter",
    "shard_setting",
    "shards_of",
    "single_set_beside",
]

#: Default shard count: one hash tag, the key names of an unsharded crawl.
DEFAULT_SHARDS = 1
#: Most shards: one script call per shard per round when the crawl is idle; more shards
#: than cluster masters (times a few, for rebalancing) buy nothing.
MAX_SHARDS = 1024


def read_layout(stored: bytes | str | None) -> tuple[int, int]:
    """(count, span) of a crawl's stored layout (``ha:{S}:shards``): ``"<count>"`` or
    ``"<count> <span>"`` (see :mod:`scrapy_ha.keys`); (1, 1) when there is none (or it
    cannot be read)."""
    text = stored.decode(errors="replace") if isinstance(stored, bytes) else stored or ""
    words = text.split()
    if not 1 <= len(words) <= 2 or not all(w.isdigit() for w in words):
        return 1, 1
    count = max(1, int(words[0]))
    return count, max(count, int(words[-1]))


def layout_problem(stored: bytes | str) -> str | None:
    """What is wrong with a crawl's stored layout (``ha:{S}:shards``), as a clause after
    the key's name; None when it is one scrapy-ha writes: ``"<count>"`` or ``"<count>
    <span>"`` in ASCII digits, 2 <= count <= span <= MAX_SHARDS (one shard writes none).
    :func:`read_layout` takes any other for one shard, whose keys the crawl has none on."""
    text = stored.decode(errors="replace") if isinstance(stored, bytes) else stored
    words = text.split(" ")
    if 1 <= len(words) <= 2 and all(w.isascii() and w.isdecimal() and len(w) < 6 for w in words):
        count, span = int(words[0]), int(words[-1])
        if 2 <= count <= span <= MAX_SHARDS:
            return None
    return (
        f"holds {text[:40]!r}, not a shard count ('<count>' or '<count> <span>', whole "
        f"numbers from 2 to {MAX_SHARDS}, as the first worker writes it)"
    )


def layout_keys(prefix: str, spider: str, stored: bytes | str | None) -> Keys:
    """The crawl's keys (shard 0's when it is sharded) for its stored layout."""
    count, span = read_layout(stored)
    if count == 1:
        return Keys(prefix, spider)
    return Keys(prefix, spider, 0, count, span if span > count else 0)


async def queue_in_redis(client: Any, prefix: str, spider: str) -> RedisQueue:
    """The crawl's queue as the layout in Redis has it (one shard when there is none)."""
    count, span = read_layout(await client.get(Keys(prefix, spider).shard_count))
    return make_queue(client, prefix, spider, count, span=span)


def shard_setting(settings: BaseSettings) -> int:
    """``HA_SHARDS``, checked (a ConfigError names the setting and the value)."""
    return check.whole(settings, "HA_SHARDS", DEFAULT_SHARDS, maximum=MAX_SHARDS)


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
    span: int = 0,
) -> RedisQueue:
    """The crawl's queue: a RedisQueue at one shard, a ShardedQueue beyond (over *span*
    shards when an earlier run of the crawl kept things on more than *shards*)."""
    if shards == 1:
        return RedisQueue(client, Keys(prefix, spider), order=order, start_order=start_order)
    return ShardedQueue(
        client,
        Keys(prefix, spider, 0, shards, span if span > shards else 0),
        order=order,
        start_order=start_order,
        worker=worker,
        heartbeat_ms=heartbeat_ms,
    )


def shards_of(queue: RedisQueue) -> list[RedisQueue]:
    """The per-shard queues of *queue* (itself when it is not sharded)."""
    return list(queue.shards) if isinstance(queue, ShardedQueue) else [queue]


async def check_shard_count(queue: RedisQueue) -> None:
    """Refuse a writer whose ``HA_SHARDS`` differs from the crawl's in Redis (it would put
    requests in the wrong shards); the first writer of a sharded crawl writes it. (A worker
    joins instead, see :mod:`scrapy_ha.store.lifecycle`: a finished crawl may change its
    count.)"""
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
    have = read_layout(stored)[0]
    if have != wanted:
        raise ConfigError(
            f"HA_SHARDS={wanted} but the crawl of {keys.spider} is in Redis with "
            f"HA_SHARDS={have} (key {keys.shard_count}): run it with HA_SHARDS={have}, or "
            f"`scrapy-ha flush {keys.spider} --shards {have}` first to start it again"
        )


async def set_dupefilter(
    queue: RedisQueue,
    config: MemoryConfig,
    ttl: float = 0.0,
    *,
    claim: bool = True,
    worker: str = "",
    fix: str | None = None,
    warn: bool = True,
) -> None:
    """Give every shard of *queue* the crawl's dupefilter (``HA_DUPEFILTER``): the exact
    set (in time slices with ``HA_DUPEFILTER_TTL``, *ttl* seconds), or the Bloom filter as
    stored (one made with other settings is kept, and said so once). A kind the crawl in
    Redis does not have is refused: its dupefilter would be empty, and every URL the crawl
    had seen crawled again. With *claim*, the kind is claimed too (:func:`claim_kind`, by
    *worker*); without, the caller claims it before its first write. *fix* ends a refusal
    (by default: the same settings, or ``scrapy-ha flush`` first). *warn*: a worker's
    WARNING that the crawl's filter, made with other settings, is kept (not for ``push``,
    which takes the crawl's filter as it is); a single set beside the buckets is said
    either way (:func:`say_single_set`: some URLs are crawled twice, pushed ones too)."""
    for i, shard in enumerate(shards_of(queue)):
        said = warn and i == 0
        shard.dupefilter = await _dupefilter(shard, config, warn=said, ttl=ttl, fix=fix)
    if not warn and (found := await single_set_beside(queue)):
        say_single_set(*found)
    if claim:
        await claim_kind(queue, config, ttl, worker)


#: How a worker's refusal ends: the same settings as the crawl's, or a new crawl.
_FLUSH_FIX = "or `scrapy-ha flush {spider}` first to start it again"


async def _dupefilter(
    queue: RedisQueue, config: MemoryConfig, *, warn: bool, ttl: float = 0.0, fix: str | None
) -> Dupefilter:
    keys, client = queue.keys, queue.client
    # what is stored, read in one round trip (a worker's start waits for each)
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.bloom)
    pipe.hgetall(keys.buckets)
    pipe.exists(keys.aged)
    pipe.exists(keys.dupefilter)
    raw_meta, raw_buckets, aged, single = await pipe.execute()
    meta = {_s(k): _s(v) for k, v in raw_meta.items()}
    fix = fix or _FLUSH_FIX.format(spider=keys.spider)
    buckets = bucket_state(raw_buckets)
    if config.dupefilter == "set":
        if meta:
            raise ConfigError(
                f"HA_DUPEFILTER='set' but the crawl of {keys.spider} in Redis has a Bloom "
                f"filter ({keys.bloom}): run it with HA_DUPEFILTER='bloom', {fix}"
            )
        if ttl and buckets:
            raise ConfigError(
                f"HA_DUPEFILTER_TTL={ttl:g} but the crawl of {keys.spider} in Redis keeps its "
                f"exact set in buckets ({keys.buckets}), which keep no time: run it without "
                f"HA_DUPEFILTER_TTL, {fix}"
            )
        if ttl:  # (a single set of a crawl kept for ever is taken over, not said)
            _beside(keys, "aged", bool(single and aged and warn))
            return AgedSet(int(ttl * 1000))
        if aged:
            raise ConfigError(
                f"HA_DUPEFILTER='set' without HA_DUPEFILTER_TTL, but the crawl of {keys.spider} "
                f"in Redis keeps its exact set in time slices ({keys.aged}): run it with "
                f"HA_DUPEFILTER_TTL (every worker of a crawl with the same), {fix}"
            )
        return _exact(keys, config, buckets, bool(single), warn=warn)
    if buckets:
        raise ConfigError(
            f"HA_DUPEFILTER='bloom' but the crawl of {keys.spider} in Redis has an exact set "
            f"of {buckets.urls} fingerprints in buckets ({keys.buckets}): run it with "
            f"HA_DUPEFILTER='set', {fix}"
        )
    if aged:
        raise ConfigError(
            f"HA_DUPEFILTER='bloom' but the crawl of {keys.spider} in Redis keeps its exact set "
            f"in time slices ({keys.aged}, HA_DUPEFILTER_TTL): run it with HA_DUPEFILTER='set', "
            f"{fix}"
        )
    _beside(keys, "bloom", bool(single and meta and warn))  # by a worker of a version before it
    if single and not meta and (seen := await client.scard(keys.dupefilter)):
        raise ConfigError(
            f"HA_DUPEFILTER='bloom' but the crawl of {keys.spider} in Redis has an exact set "
            f"of {seen} fingerprints ({keys.dupefilter}): run it with HA_DUPEFILTER='set', {fix}"
        )
    if ttl or "period" in meta:
        return _aged_bloom(keys, config, meta, ttl, warn=warn, fix=fix)
    bloom = BloomFilter(config.capacity, config.error_rate)
    asked = (bloom.capacity, bloom.k)
    if bloom.learn(meta) and (bloom.capacity, bloom.k) != asked and warn:
        logger.warning(
            "The Bloom filter of the crawl of %s was made with HA_DUPEFILTER_CAPACITY=%d and "
            "HA_DUPEFILTER_ERROR_RATE=%g: it is kept as it is (this worker's settings, %d and "
            "%g, apply to a new crawl)",
            keys.spider,
            bloom.capacity,
            bloom.error_rate,
            config.capacity,
            config.error_rate,
        )
    return bloom


def _beside(keys: Keys, kept: str, said: bool) -> None:
    """Say that a single set is beside what the crawl keeps (*kept*), if *said*."""
    if said:
        say_single_set(keys, kept)


def _aged_bloom(
    keys: Keys, config: MemoryConfig, meta: dict[str, str], ttl: float, *, warn: bool, fix: str
) -> Dupefilter:
    """The Bloom filter in time slices (HA_DUPEFILTER_TTL), as stored: a crawl keeps its
    filter for ever or in slices, and a worker of the other kind is refused."""
    stored = AgedBloom.stored(meta)
    if not ttl:
        raise ConfigError(
            f"HA_DUPEFILTER='bloom' without HA_DUPEFILTER_TTL, but the crawl of {keys.spider} "
            f"in Redis keeps its Bloom filter in time slices ({keys.bloom}): run it with "
            f"HA_DUPEFILTER_TTL (every worker of a crawl with the same), {fix}"
        )
    if meta and stored is None:
        raise ConfigError(
            f"HA_DUPEFILTER_TTL={ttl:g} but the crawl of {keys.spider} in Redis keeps its "
            f"Bloom filter for ever ({keys.bloom}), and a Bloom filter cannot take a URL out: "
            f"run it without HA_DUPEFILTER_TTL, {fix}"
        )
    slices = AgedBloom.for_crawl(config.capacity, config.error_rate, int(ttl * 1000))
    if stored is None:
        return slices
    if (stored.capacity, stored.k) != (slices.capacity, slices.k) and warn:
        logger.warning(
            "The Bloom filter in time slices of the crawl of %s was made with other "
            "HA_DUPEFILTER_CAPACITY or HA_DUPEFILTER_ERROR_RATE (slices of %d URLs, %d bit "
            "positions, at most %g): it is kept as it is (this worker's, %d and %g, apply to a "
            "new crawl)",
            keys.spider,
            stored.capacity,
            stored.k,
            stored.error_rate,
            config.capacity,
            config.error_rate,
        )
    stored.ttl_ms = slices.ttl_ms  # the layout as stored, the TTL as set now
    return stored


def _exact(
    keys: Keys, config: MemoryConfig, stored: BucketState | None, single: bool, *, warn: bool
) -> Dupefilter:
    """The exact set: in buckets, their count as *stored* (or from HA_DUPEFILTER_CAPACITY
    for a crawl made now); the *single* set for a crawl made before the buckets that has
    one."""
    wanted = bucket_count(config.capacity)
    if stored is None and single:
        if warn:
            logger.info(
                "The crawl of %s keeps its dupefilter in one set (%s, made before the buckets): "
                "it is kept as it is (a crawl made now keeps it in buckets, 8 bytes a URL)",
                keys.spider,
                keys.dupefilter,
            )
        return ExactSet()
    if stored is not None and warn and single:
        say_single_set(keys)
    if stored is not None and stored.buckets != wanted and warn:
        logger.warning(
            "The dupefilter of the crawl of %s has %d buckets (made for %d URLs): they are kept "
            "as they are (this worker's HA_DUPEFILTER_CAPACITY=%d, %d buckets, applies to a "
            "new crawl)",
            keys.spider,
            stored.buckets,
            stored.capacity,
            config.capacity,
            wanted,
        )
    return BucketSet(stored.buckets if stored else wanted)


async def dupefilter_figures(queue: RedisQueue) -> dict[str, float]:
    """The crawl's Bloom filter as worker stats: URLs added, the chance now that a new URL
    is taken for a seen one (the worst shard's), and the URLs expected lost so far; or the
    exact set's buckets: URLs held, and 1 in ``ha/dupefilter/over_capacity`` once a shard
    holds more than its buckets were made for."""
    now_ms, metas = await _clock_and_metas(queue)
    try:
        found = [state for bloom, _ in metas if (state := bloom_state(bloom, now_ms)) is not None]
    except ValueError:  # garbage (BloomMetaError; the tools name it): no figures, and the
        return {}  # close goes on
    if not found:
        try:
            held = [bucket_state(stored) for _, stored in metas]
        except ValueError:  # (the buckets' meta holding garbage: the same)
            return {}
        buckets = [b for b in held if b is not None]
        if not buckets:
            return {}
        return {
            "ha/dupefilter/urls": sum(b.urls for b in buckets),
            "ha/dupefilter/over_capacity": int(any(b.over for b in buckets)),
        }
    return {
        "ha/dupefilter/urls": sum(s.urls for s in found),
        "ha/dupefilter/error_rate": max(s.error_now for s in found),
        "ha/dupefilter/false_positives": sum(s.expected_false_positives for s in found),
    }


async def _clock_and_metas(queue: RedisQueue) -> tuple[int, list[tuple[dict[Any, Any], ...]]]:
    """Redis's clock and each shard's :func:`filter_metas`: in one round trip for one shard
    on one server (a cluster's pipelines take no ``TIME``)."""
    client = queue.client
    if len(shards_of(queue)) > 1 or isinstance(client, redis.asyncio.RedisCluster):
        return await server_ms(client), [
            await filter_metas(q.client, q.keys) for q in shards_of(queue)
        ]
    pipe = client.pipeline(transaction=False).time().hgetall(queue.keys.bloom)
    clock, bloom, buckets = await pipe.hgetall(queue.keys.buckets).execute()
    return time_ms(clock), [(bloom, buckets)]
