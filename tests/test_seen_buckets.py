"""The exact dupefilter in buckets of 64-bit integers (store/buckets.py, lua/lib/seen.lua)
against a real redis-server: each bucket stays an intset (8 bytes a URL), the count is
stored with the crawl and kept by every client whatever its setting, a crawl that
outgrows its capacity stays exact, the counter follows adds and forgets, a crawl made
before the buckets keeps its single set, and flush and finish delete every bucket."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any

import pytest
import redis
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.config.memory import MemoryConfig
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.keys import FINGERPRINT_BYTES, Keys
from scrapy_ha.ops.dupefilter import buckets_lines, dupefilter_json
from scrapy_ha.store import buckets as buckets_module
from scrapy_ha.store import scripts
from scrapy_ha.store.bloom import ExactSet
from scrapy_ha.store.buckets import (
    BUCKET_FILL,
    MIN_BUCKETS,
    BucketSet,
    BucketState,
    bucket_count,
    bucket_of,
    bucket_state,
    delete_buckets,
    member_of,
    read_buckets,
    wire_fingerprint,
)
from scrapy_ha.store.forget import forget_fingerprints, seen_where
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.sharding import dupefilter_figures, make_queue, set_dupefilter
from scrapy_ha.store.wire import NewEntry
from tests import redis_servers
from tests.test_cli import scrapy_ha

KEYS = Keys("ha", "bk")


def fingerprint(i: int, salt: bytes = b"") -> bytes:
    return hashlib.sha1(b"%sURL %d" % (salt, i)).digest()[:FINGERPRINT_BYTES]


def entries(ids: range, salt: bytes = b"") -> list[NewEntry]:
    return [NewEntry(fingerprint(i, salt), 0, b'{"v":1,"u":"http://a/%d"}' % i) for i in ids]


async def add(queue: RedisQueue, items: list[NewEntry], batch: int = 500) -> int:
    added = 0
    for start in range(0, len(items), batch):
        added += await queue.enqueue(items[start : start + batch])
    return added


def memory(capacity: int) -> MemoryConfig:
    return MemoryConfig(capacity=capacity)


async def joined(url: str, capacity: int = 1000) -> RedisQueue:
    """A client that joined the crawl as a worker does (set_dupefilter)."""
    queue = RedisQueue(redis.asyncio.Redis.from_url(url), KEYS)
    await set_dupefilter(queue, memory(capacity))
    return queue


def test_the_bucket_count_keeps_76_bits_and_each_bucket_under_the_intset_limit():
    assert bucket_count(1000) == MIN_BUCKETS == 2**12  # 64 + 12 bits
    assert bucket_count(10**7) == 2**15  # the default capacity: 305 a bucket at capacity
    assert bucket_count(10**9) == 2**22
    for capacity in (10**6, 10**7, 10**9, 10**12):
        count = bucket_count(capacity)
        assert capacity / count <= BUCKET_FILL < 2 * capacity / count or count == MIN_BUCKETS


def test_the_wire_form_is_the_bucket_bytes_then_the_member_in_decimal():
    fp = bytes(range(1, 13))
    assert member_of(fp) == 0x0102030405060708
    assert wire_fingerprint(fp) == bytes([9, 10, 11, 12]) + b"72623859790382856"
    negative = b"\xff" * 8 + b"\x00\x00\x10\x01"
    assert wire_fingerprint(negative) == b"\x00\x00\x10\x01-1"
    assert bucket_of(negative, 4096) == 1 and wire_fingerprint(b"") == b""


@deferred_f_from_coro_f
async def test_urls_are_filtered_exactly_and_each_bucket_is_an_intset(redis_url):
    queue = await joined(redis_url)
    assert queue.dupefilter == BucketSet(4096)
    assert await add(queue, entries(range(20000))) == 20000
    assert await add(queue, entries(range(20000))) == 0  # every one seen
    assert await add(queue, entries(range(19990, 20010))) == 10
    state = bucket_state(await queue.client.hgetall(KEYS.buckets))
    assert state is not None and state.buckets == 4096 and state.urls == 20010
    assert (await queue.counts()).fingerprints == 20010  # counted from the meta hash
    fp = fingerprint(7)
    key = state.key(KEYS, bucket_of(fp, 4096))
    assert await queue.client.sismember(key, member_of(fp))
    assert await queue.client.object("encoding", key) == b"intset"
    assert not await queue.client.exists(KEYS.dupefilter)  # no single set
    await queue.client.aclose()


@deferred_f_from_coro_f
async def test_the_stored_count_is_kept_by_a_worker_whose_setting_differs(redis_url, caplog):
    first = await joined(redis_url, capacity=1000)
    await add(first, entries(range(100)))
    other = await joined(redis_url, capacity=10**8)  # would make 2^18 buckets
    assert other.dupefilter == BucketSet(4096)
    assert "has 4096 buckets" in caplog.text
    assert await add(other, entries(range(150))) == 50
    # a client that joined before the crawl existed and asks for another count still adds
    # to the stored one: the script keeps the count it finds
    late = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    late.dupefilter = BucketSet(2**16)
    assert await add(late, entries(range(200))) == 50
    state = bucket_state(await first.client.hgetall(KEYS.buckets))
    assert state is not None and state.buckets == 4096 and state.urls == 200
    for q in (first, other, late):
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_crawl_past_its_capacity_stays_exact(redis_client, redis_url):
    redis_client.config_set("set-max-intset-entries", 8)  # buckets overflow at 8 members
    try:
        queue = await joined(redis_url)
        n = 4096 * 12
        assert await add(queue, entries(range(n)), batch=2000) == n
        assert await add(queue, entries(range(n)), batch=2000) == 0
        state = bucket_state(await queue.client.hgetall(KEYS.buckets))
        encodings = {
            await queue.client.object("encoding", state.key(KEYS, i)) for i in range(0, 4096, 97)
        }
        assert b"hashtable" in encodings and state.urls == n
        assert await dupefilter_figures(queue) == {
            "ha/dupefilter/urls": n,
            "ha/dupefilter/over_capacity": 0,  # 12 a bucket: within 384 (the real limit)
        }
        await queue.client.aclose()
    finally:
        redis_client.config_set("set-max-intset-entries", 512)


@deferred_f_from_coro_f
async def test_forget_and_check_follow_the_buckets_and_the_count(redis_url):
    queue = await joined(redis_url)
    await add(queue, entries(range(10)))
    fp = fingerprint(3)
    assert await seen_where(queue.client, KEYS, fp) == [("set", 0)]
    assert await forget_fingerprints(queue.client, KEYS, [fp, fingerprint(99)]) == 1
    assert await seen_where(queue.client, KEYS, fp) == []
    assert (await queue.counts()).fingerprints == 9
    assert await add(queue, entries(range(10))) == 1  # the forgotten one only
    await queue.client.aclose()


@deferred_f_from_coro_f
async def test_a_crawl_made_before_the_buckets_keeps_its_single_set(redis_url, caplog):
    caplog.set_level(logging.INFO, "scrapy_ha.store.sharding")
    client = redis.asyncio.Redis.from_url(redis_url)
    await client.sadd(KEYS.dupefilter, *(fingerprint(i) for i in range(50)))
    queue = await joined(redis_url)
    assert isinstance(queue.dupefilter, ExactSet) and "made before the buckets" in caplog.text
    assert await add(queue, entries(range(80))) == 30
    assert await client.scard(KEYS.dupefilter) == 80
    assert not await client.exists(KEYS.buckets)
    assert await seen_where(client, KEYS, fingerprint(60)) == [("set", 0)]
    assert (await queue.counts()).fingerprints == 80
    await client.aclose()
    await queue.client.aclose()


@deferred_f_from_coro_f
async def test_a_crawl_in_buckets_refuses_a_ttl_and_a_bloom_filter(redis_url):
    queue = await joined(redis_url)
    await add(queue, entries(range(5)))
    with pytest.raises(ConfigError, match="in buckets"):
        await set_dupefilter(queue, memory(1000), ttl=60.0)
    with pytest.raises(ConfigError, match="HA_DUPEFILTER='bloom'"):
        await set_dupefilter(queue, MemoryConfig(dupefilter="bloom"))
    await queue.client.aclose()


@deferred_f_from_coro_f
async def test_flush_deletes_every_bucket_and_a_new_crawl_starts_empty(redis_url):
    queue = await joined(redis_url)
    await add(queue, entries(range(3000)))
    await queue.client.set(b"ha:{bk}:buckets:\xff", 1)  # a name not UTF-8, by hand (review)
    await queue.flush()
    assert [k async for k in queue.client.scan_iter(match="ha:{bk}:*")] == []
    again = await joined(redis_url)
    assert await add(again, entries(range(3000))) == 3000
    await queue.client.aclose()
    await again.client.aclose()


def _drop_calls(writes: list[Any]) -> int:
    return sum(1 for w in writes if b"EVALSHA" in b"".join(bytes(c) for c in w)[:40])


@deferred_f_from_coro_f
async def test_a_finish_deletes_its_buckets_by_range_not_by_name(
    redis_url, monkeypatch, redis_writes
):
    """The worker sends a generation and a range a call (lua/drop_buckets.lua), not the
    name of every bucket: a crawl sized for a billion URLs has 4 M of them."""
    monkeypatch.setattr(buckets_module, "DELETE_BATCH", 1024)  # several calls for 4,096
    queue = await joined(redis_url)
    await add(queue, entries(range(3000)))
    client = queue.client
    state = await read_buckets(client, KEYS)
    assert state is not None and state.buckets == 4096
    older = BucketState(state.buckets, "1", 0)  # another generation: not this finish's
    await client.sadd(older.key(KEYS, 0), 1)
    for edge in range(0, state.buckets + 1, 1024):  # both sides of every call's range
        for bucket in (edge - 1, edge):
            if 0 <= bucket < state.buckets:
                await client.sadd(state.key(KEYS, bucket), 1)
    await delete_buckets(client, BucketState(1, "0", 0), KEYS)  # the script loaded before
    redis_writes.clear()
    sent = (await client.info("stats"))["total_net_input_bytes"]
    await delete_buckets(client, state, KEYS)
    sent = (await client.info("stats"))["total_net_input_bytes"] - sent
    assert _drop_calls(redis_writes) == 4
    # a set: SCAN may name a key twice while Redis rehashes the table it shrinks
    assert {k async for k in client.scan_iter(match=f"{KEYS.buckets}:*")} == {
        older.key(KEYS, 0).encode()
    }
    assert sent < 4096, sent  # names: some 30 bytes a bucket, 120 KB for these 4096
    await client.delete(older.key(KEYS, 0))
    await client.aclose()


@deferred_f_from_coro_f
async def test_the_default_capacitys_buckets_go_in_four_calls(redis_url, redis_writes):
    """32,768 buckets (HA_DUPEFILTER_CAPACITY's default): a call each 8,192, not 2,048 (a
    finish waited for 16 round trips; a call costs Redis about 3.5 ms)."""
    client = redis.asyncio.Redis.from_url(redis_url)
    state = BucketState(bucket_count(10_000_000), "5", 0)
    assert state.buckets == 32768
    await client.sadd(state.key(KEYS, 0), 1)
    await client.sadd(state.key(KEYS, 32767), 2)
    await delete_buckets(client, BucketState(1, "0", 0), KEYS)  # the script loaded before
    redis_writes.clear()
    await delete_buckets(client, state, KEYS)
    assert _drop_calls(redis_writes) == 4
    assert [k async for k in client.scan_iter(match=f"{KEYS.buckets}:*")] == []
    await client.aclose()


@deferred_f_from_coro_f
async def test_a_drop_unlinks_a_thousand_buckets_a_command_and_counts_those_there(tmp_path):
    """A crawl's finish drops every bucket its count names (32,768 for the default
    capacity), most of them never made in a small crawl: one UNLINK of many names, not one
    a bucket. A server of its own: its count of UNLINKs is this test's alone."""
    server = redis_servers.start(tmp_path / "redis")
    queue = await joined(f"redis://127.0.0.1:{server.port}/0")
    client = queue.client
    try:
        await add(queue, entries(range(3000)))
        state = await read_buckets(client, KEYS)
        assert state is not None and state.buckets == 4096
        made = {k async for k in client.scan_iter(match=f"{KEYS.buckets}:*", count=10_000)}
        drop = client.register_script(scripts.DROP_BUCKETS_LUA)
        with pytest.raises(redis.exceptions.ResponseError, match="bad range"):
            await drop(keys=[KEYS.buckets], args=[state.gen, 0, 2.5])

        def unlinks(stats: dict) -> int:
            return int(stats.get("cmdstat_unlink", {}).get("calls", 0))

        before = unlinks(await client.info("commandstats"))
        dropped = await drop(keys=[KEYS.buckets], args=[state.gen, 0, 2047])
        dropped += await drop(keys=[KEYS.buckets], args=[state.gen, 2048, 4095])
        assert dropped == len(made)
        after = unlinks(await client.info("commandstats"))
        assert after - before == 6  # 1000 + 1000 + 48, twice
        assert [k async for k in client.scan_iter(match=f"{KEYS.buckets}:*")] == []
    finally:
        await client.aclose()
        server.kill()


@deferred_f_from_coro_f
async def test_each_shard_keeps_its_own_buckets_and_counts_add_up(redis_url):
    client = redis.asyncio.Redis.from_url(redis_url)
    queue = make_queue(client, "ha", "sh", 3)
    await set_dupefilter(queue, memory(1000))
    assert await add(queue, entries(range(3000))) == 3000
    assert await add(queue, entries(range(3000))) == 0
    held = [bucket_state(await client.hgetall(Keys("ha", "sh", i, 3).buckets)) for i in range(3)]
    assert all(s is not None and 800 < s.urls < 1200 for s in held)
    assert sum(s.urls for s in held) == (await queue.counts()).fingerprints == 3000
    fp = fingerprint(11)
    assert await seen_where(client, Keys("ha", "sh", 0, 3), fp) == [("set", 0)]
    await queue.flush()
    assert [k async for k in client.scan_iter(match="ha:{sh*")] == []
    await client.aclose()


def test_a_crawl_past_its_capacity_says_so(redis_url):
    over = BucketState(4096, "1", 4096 * BUCKET_FILL + 1)
    assert over.over and not BucketState(4096, "1", 4096 * BUCKET_FILL).over
    (line,) = buckets_lines([over])
    assert "past the 1,572,864 its buckets were made for" in line
    assert dupefilter_json([], [over])["over_capacity"] is True


SHORT = [
    (1234567890123456789).to_bytes(8, "big", signed=True),  # 8 bytes: the same last digits
    (2234567890123456789).to_bytes(8, "big", signed=True),
    bytes(range(1, 9)) + b"\x00",  # 9 bytes, told apart by the ninth
    bytes(range(1, 9)) + b"\xff",
    b"\x00\x00\x00\x00\x07\x5b\xcd\x15",  # 8 and 4 bytes of one integer
    b"\x07\x5b\xcd\x15",
    b"\x05",  # one byte
]


@deferred_f_from_coro_f
async def test_fingerprints_shorter_than_twelve_bytes_are_told_apart(redis_url):
    """A project's fingerprinter may make them shorter than the 12 bytes a bucket and its
    member are read from: each is still its own, and `seen check` finds it where the
    scripts put it."""
    queue = await joined(redis_url)
    assert isinstance(queue.dupefilter, BucketSet)
    for i, fp in enumerate(SHORT):
        assert await add(queue, [NewEntry(fp, 0, b'{"v":1,"u":"http://a/%d"}' % i)]) == 1, fp
        assert await seen_where(queue.client, KEYS, fp) == [("set", 0)], fp
    assert await add(queue, [NewEntry(fp, 0, b'{"v":1,"u":"http://a/x"}') for fp in SHORT]) == 0
    await queue.client.aclose()


@deferred_f_from_coro_f
async def test_a_single_set_beside_the_buckets_is_said(redis_url, caplog):
    """A worker of a version before the buckets that joined a crawl in buckets writes the
    single set: the two versions do not see each other's URLs, and a worker says so."""
    queue = await joined(redis_url)
    assert await add(queue, entries(range(1))) == 1
    await queue.client.sadd(KEYS.dupefilter, fingerprint(2))  # what the older version writes
    with caplog.at_level(logging.WARNING, logger="scrapy_ha.store.single_set"):
        again = await joined(redis_url)
    assert isinstance(again.dupefilter, BucketSet)
    assert "a single set" in caplog.text and "one version" in caplog.text
    for q in (queue, again):
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_push_says_a_single_set_beside_the_buckets(redis_url):
    """``scrapy-ha push`` into a crawl in buckets that a worker of an older version wrote a
    single set beside: the URLs it pushes are checked against the buckets alone, and the
    older worker's against the set (some crawled twice). The push said so, as a worker does,
    until it stopped saying every WARNING of its dupefilter to keep one quiet."""
    queue = await joined(redis_url)
    assert await add(queue, entries(range(1))) == 1
    await queue.client.sadd(KEYS.dupefilter, fingerprint(2))  # what the older version writes
    await queue.client.aclose()
    args = ("--redis-url", redis_url, "push", KEYS.spider, "http://a.test/pushed")
    pushed = await asyncio.to_thread(scrapy_ha, *args)
    assert pushed.returncode == 0 and "1 added" in pushed.stdout, pushed.stderr
    assert "a single set" in pushed.stderr and "one version" in pushed.stderr, pushed.stderr
