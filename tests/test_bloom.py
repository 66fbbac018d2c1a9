"""The Bloom-filter dupefilter (``HA_DUPEFILTER = "bloom"``, lua/lib/seen.lua) against a real
redis-server: the layout the worker names agrees with the scripts', a URL seen is always
filtered (across layers, parts and clients that knew fewer layers), the false-positive
rate at capacity is the one the layout promises, and a filter is flushed, finished and
counted whole."""

from __future__ import annotations

import hashlib

import pytest
import redis.asyncio
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.config.validate import ConfigError
from scrapy_ha.keys import Keys
from scrapy_ha.store import scripts
from scrapy_ha.store.bloom import (
    MAX_PART_BYTES,
    SDS_BYTES,
    BloomFilter,
    bloom_k,
    layer_sizes,
)
from scrapy_ha.store.bloom_state import bloom_state
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry

KEYS = Keys("ha", "b")


def fingerprint(i: int, salt: bytes = b"") -> bytes:
    return hashlib.sha1(b"%sURL %d" % (salt, i)).digest()[:16]


def entries(ids: range, salt: bytes = b"") -> list[NewEntry]:
    return [NewEntry(fingerprint(i, salt), 0, b'{"v":1,"u":"http://a/%d"}' % i) for i in ids]


def bloom_queue(url: str, capacity: int, error: float = 1e-3, part: int = MAX_PART_BYTES):
    queue = RedisQueue(redis.asyncio.Redis.from_url(url), KEYS)
    queue.dupefilter = BloomFilter(capacity, error, part=part)
    return queue


async def add(queue: RedisQueue, items: list[NewEntry], batch: int = 200) -> int:
    added = 0
    for start in range(0, len(items), batch):
        added += await queue.enqueue(items[start : start + batch])
    return added


def lua_sizes(client, capacity: int, k: int, part: int, layer: int) -> list[int]:
    body = (
        '--- @include "seen"\n'
        "local L = bloom_layer({cap = tonumber(ARGV[1]), k = tonumber(ARGV[2]), "
        "part = tonumber(ARGV[3])}, tonumber(ARGV[4]))\n"
        "return L.sizes\n"
    )
    text = scripts.PLACEHOLDER.sub(scripts._constant, scripts._expand(body, "t.lua", set()))
    return client.eval(text, 0, capacity, k, part, layer)


@pytest.mark.parametrize(
    ("capacity", "error", "part"),
    [(1, 0.1, MAX_PART_BYTES), (1000, 1e-6, MAX_PART_BYTES), (10**6, 1e-6, MAX_PART_BYTES),
     (10**9, 1e-6, MAX_PART_BYTES), (12345, 1e-3, 3000), (10**7, 1e-9, 2**20 - SDS_BYTES)],
)  # fmt: skip
def test_the_worker_and_the_scripts_agree_on_the_layout(redis_client, capacity, error, part):
    k = bloom_k(error)
    for layer in range(4):
        sizes = layer_sizes(capacity, k, part, layer)
        assert lua_sizes(redis_client, capacity, k, part, layer) == sizes
        assert max(sizes) <= part and sum(sizes) * 8 >= capacity * 2**layer * (k + layer) / 0.7
    assert 2.0 ** -(k - 1) <= error < 2.0 ** -(k - 2)  # the bound: the least k that keeps it


def test_a_billion_url_filter_is_split_into_parts_of_at_most_512_mb():
    sizes = layer_sizes(10**9, bloom_k(1e-6), MAX_PART_BYTES, 0)
    assert len(sizes) > 1 and max(sizes) == 2**29 - SDS_BYTES  # allocated 512 MiB exactly
    assert sum(sizes) / 10**9 < 3.9  # bytes per URL: 21 positions, 30.3 bits


@deferred_f_from_coro_f
async def test_a_url_seen_is_filtered_across_layers_and_parts(redis_url):
    queue = bloom_queue(redis_url, capacity=100, part=64)  # 4 layers, parts of 64 bytes
    assert await add(queue, entries(range(1500))) >= 1500 - 5  # a few false positives at most
    state = bloom_state(await queue.client.hgetall(KEYS.bloom))
    assert (
        state is not None
        and len(state.added) == 4
        and state.urls == (await queue.counts()).fingerprints
    )
    parts = [k async for k in queue.client.scan_iter(match="ha:{b}:bloom:*")]
    assert len(parts) == sum(len(layer_sizes(100, state.k, 64, i)) for i in range(4))
    assert max([await queue.client.strlen(p) for p in parts]) == 64
    assert await add(queue, entries(range(1500))) == 0  # every one seen: no false negative
    await queue.client.aclose()


@deferred_f_from_coro_f
async def test_a_client_that_knew_fewer_layers_learns_them_and_filters_the_same(redis_url):
    first, late = bloom_queue(redis_url, 50), bloom_queue(redis_url, 50)
    await add(first, entries(range(20)), batch=20)
    await add(late, entries(range(5)))  # knows none yet
    await add(first, entries(range(20, 700)), batch=20)  # grows three more
    assert late.dupefilter.layers == 0 and first.dupefilter.layers == 4
    assert await add(late, entries(range(700))) == 0  # refused once, learns, filters all
    assert late.dupefilter.layers == 4
    assert bloom_state(await late.client.hgetall(KEYS.bloom)).added == (50, 100, 200, 350)
    await first.client.aclose()
    await late.client.aclose()


@deferred_f_from_coro_f
async def test_the_false_positive_rate_at_capacity_is_the_layouts(redis_url):
    # at capacity a layer errs 2^-k: the new URLs that come next are filtered that often
    queue = bloom_queue(redis_url, capacity=20_000, error=1e-2)  # k = 8: 2^-8 = 0.0039
    assert await add(queue, entries(range(20_000)), batch=1000) > 19_900
    fresh = 30_000
    added = await add(queue, entries(range(fresh), salt=b"fresh "), batch=1000)
    expected = fresh * 2.0**-8  # 117 (the new layer adds a few more, as it fills)
    assert expected / 2 < fresh - added < expected * 2
    await queue.client.aclose()


@deferred_f_from_coro_f
async def test_flush_and_finish_delete_the_whole_filter(redis_url):
    queue = bloom_queue(redis_url, capacity=50, part=32)
    await add(queue, entries(range(300)))
    await queue.flush()
    assert [k async for k in queue.client.scan_iter(match="ha:{b}:*")] == []
    await add(queue, entries(range(300)))
    await queue.lease(1000, 30000)
    leased = await queue.client.zrange(KEYS.leased, 0, -1)
    assert not (await queue.finish("w")).done  # still leased
    assert len(leased) == 300
    tokens = await queue.client.hgetall(KEYS.leases)
    await queue.ack([(i.decode(), tokens[i].split()[0].decode()) for i in leased])
    assert (await queue.finish("w")).done
    assert [k async for k in queue.client.scan_iter(match="ha:{b}:bloom*")] == []
    await queue.client.aclose()


@deferred_f_from_coro_f
async def test_flush_deletes_the_bitmaps_of_a_filter_whose_meta_hash_is_garbage(redis_url):
    """The flush named the bitmaps from the meta hash: one that lost ``layers`` (a hand
    edit) or holds garbage named none, and they stayed in Redis after the flush."""
    queue = bloom_queue(redis_url, capacity=50, part=32)
    for damage in ({"layers": None}, {"capacity": "x"}):
        await add(queue, entries(range(300)))
        for field, value in damage.items():
            if value is None:
                await queue.client.hdel(KEYS.bloom, field)
            else:
                await queue.client.hset(KEYS.bloom, field, value)
        await queue.flush()
        assert [k async for k in queue.client.scan_iter(match="ha:{b}:*")] == [], damage
    await queue.client.aclose()


@deferred_f_from_coro_f
async def test_a_bitmap_of_the_wrong_type_fails_the_call_before_any_write(redis_url):
    queue = bloom_queue(redis_url, capacity=50)
    await add(queue, entries(range(10)))
    await queue.client.delete(KEYS.bloom_part(0, 0))
    await queue.client.rpush(KEYS.bloom_part(0, 0), "garbage")
    before = (await queue.counts()).pending
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE sync"):
        await queue.enqueue(entries(range(10, 20)))
    assert (await queue.counts()).pending == before
    assert KEYS.bloom_part(0, 0) + " (list" in " ".join(await queue.set_aside_wrong_types())
    await queue.client.aclose()


class ShortFingerprinter:
    """A project's fingerprinter of 8 bytes (BLAKE2b), shorter than the Bloom filter's 16."""

    def fingerprint(self, request) -> bytes:
        return hashlib.blake2b(request.url.encode(), digest_size=8).digest()


@deferred_f_from_coro_f
async def test_a_fingerprint_shorter_than_16_bytes_keeps_its_error_rate(redis_url):
    """Its bytes 5-16 make the filter's positions: a short one left them 0 or repeated, and
    most new URLs were taken for seen (with 8 bytes, about 3 in 5 at capacity)."""
    from scrapy import Request
    from scrapy.utils.test import get_crawler

    from scrapy_ha.config.scheduler import SchedulerConfig
    from scrapy_ha.scheduler.admission import Admission

    crawler = get_crawler(settings_dict={"HA_DUPEFILTER": "bloom"})
    crawler.request_fingerprinter = ShortFingerprinter()
    admission = Admission.from_config(crawler, SchedulerConfig.from_settings(crawler.settings))
    fingerprints = [admission.fingerprint(Request(f"http://a.test/{i}")) for i in range(4000)]
    assert {len(f) for f in fingerprints} == {16}
    queue = bloom_queue(redis_url, 2000, 1e-12)  # a new URL lost: at most 4e-9 a run
    payload = b'{"v":1,"u":"http://a.test/%d"}'
    items = [NewEntry(f, 0, payload % i) for i, f in enumerate(fingerprints)]
    assert await add(queue, items) == 4000
    assert await add(queue, items) == 0  # every one seen, as ever
    await queue.client.flushdb()
    await queue.client.aclose()


@deferred_f_from_coro_f
async def test_one_call_of_more_urls_than_a_layer_holds_fills_no_layer_past_it(redis_url):
    """A call of 5,000 new URLs (a start URL feed's batch may be that large) into a filter
    of capacity 1,000: each layer holds at most its capacity (1,000, 2,000, 4,000, ...), so
    the filter's bound holds; before, the one new layer a call could make took the rest
    (4,000 in a layer of 2,000)."""
    queue = bloom_queue(redis_url, 1000, 1e-12)  # a new URL lost: at most 1.2e-8 a run
    assert await queue.enqueue(entries(range(5000))) == 5000
    state = bloom_state(await queue.client.hgetall(KEYS.bloom))
    assert state is not None and sum(state.added) == 5000
    assert all(n <= 1000 << i for i, n in enumerate(state.added)), state.added
    assert await queue.enqueue(entries(range(5000, 12000))) == 7000  # and the next call
    state = bloom_state(await queue.client.hgetall(KEYS.bloom))
    assert all(n <= 1000 << i for i, n in enumerate(state.added)), state.added
    await queue.client.flushdb()
    await queue.client.aclose()


def test_the_largest_capacity_the_settings_take_makes_a_layout_readers_accept():
    """A capacity the settings accept makes a filter whose first two layers (the second is
    asked for with the first URL) every reader accepts, at the tightest error rate; one
    above it is refused at start, naming the setting, not at the first URL as a filter no
    worker could have written."""
    from scrapy_ha.config.memory import ERROR_RATE_RANGE, MAX_DUPEFILTER_CAPACITY, MemoryConfig
    from scrapy_ha.store.bloom import MAX_PART_BYTES, bloom_k, layer_bytes

    for error in ERROR_RATE_RANGE:
        for layer in (0, 1):
            assert layer_bytes(MAX_DUPEFILTER_CAPACITY, bloom_k(error), MAX_PART_BYTES, layer)
    over = {"HA_DUPEFILTER": "bloom", "HA_DUPEFILTER_CAPACITY": MAX_DUPEFILTER_CAPACITY + 1}
    with pytest.raises(ConfigError, match="HA_DUPEFILTER_CAPACITY=50000000001"):
        MemoryConfig.from_settings(Settings(over))
