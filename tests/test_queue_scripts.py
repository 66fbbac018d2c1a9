"""Every Lua script against a real redis-server: lease, ack, renew, reclaim, fencing,
poison, promotion, release, dead-letter, finish."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.script_keys import sync_keys
from scrapy_ha.store.wire import NewEntry
from tests import redis_servers

KEYS = Keys("ha", "s")


@pytest.fixture(params=redis_servers.SCRIPT_PATHS)
def redis_url(request: pytest.FixtureRequest, redis_url: str) -> str:
    """Each test twice: the sync script as a Redis function, and with EVALSHA."""
    return redis_servers.script_path_url(redis_url, request.param)


def entry(name: str, priority: int = 0, fp: bytes | None = None) -> NewEntry:
    return NewEntry(name.encode() if fp is None else fp, priority, f"payload-{name}".encode())


def open_queue(url: str) -> RedisQueue:
    return RedisQueue(redis.asyncio.Redis.from_url(url), KEYS)


def payloads(leases: list) -> list[bytes]:
    return [lease.payload for lease in leases]


@deferred_f_from_coro_f
async def test_enqueue_filters_duplicates_but_not_unfiltered_requests(redis_url):
    q = open_queue(redis_url)
    added = await q.enqueue([entry("a"), entry("a"), entry("x", fp=b""), entry("y", fp=b"")])
    assert added == 3
    added = await q.enqueue([entry("a"), NewEntry(b"", 0, b"payload-x")])
    assert added == 1  # "a" seen before; the unfiltered copy of x is kept
    counts = await q.counts()
    assert (counts.pending, counts.fingerprints) == (4, 1)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_lease_order_is_priority_then_fifo(redis_url):
    q = open_queue(redis_url)
    await q.enqueue(
        [entry("low1", -1), entry("n1"), entry("high", 5), entry("n2"), entry("low2", -1)]
    )
    await q.enqueue([entry("n3"), entry("top", 9000)])  # clamped to the maximum, still first
    leases = await q.lease(10, 30000)
    assert payloads(leases) == [
        b"payload-top",
        b"payload-high",
        b"payload-n1",
        b"payload-n2",
        b"payload-n3",
        b"payload-low1",
        b"payload-low2",
    ]
    assert len({lease.token for lease in leases}) == 7
    counts = await q.counts()
    assert (counts.pending, counts.leased) == (0, 7)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_ack_is_fenced_by_token(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([entry("a"), entry("b")])
    a, b = await q.lease(2, 30000)
    assert await q.ack([(a.id, "wrong-token"), (b.id, b.token)]) == (1, 1)
    assert await q.ack([(b.id, b.token)]) == (0, 1)  # acking twice does nothing
    counts = await q.counts()
    assert (counts.pending, counts.leased) == (0, 1)
    assert await q.client.hexists(KEYS.payload, a.id)
    assert not await q.client.hexists(KEYS.payload, b.id)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_one_ack_given_twice_in_one_call_counts_once(redis_url):
    """A worker's round may carry an ack twice (sent again after a reply it did not get):
    the second is stale, the lease ends once and the acked counter moves by one."""
    q = open_queue(redis_url)
    await q.enqueue([entry("a"), entry("b")])
    a, _ = await q.lease(2, 30000)
    assert await q.ack([(a.id, a.token), (a.id, a.token)]) == (1, 1)
    assert int(await q.client.hget(KEYS.stats, "acked")) == 1
    assert (await q.counts()).leased == 1
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_sync_enqueues_children_before_acking_the_parent(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([entry("parent")])
    (parent,) = await q.lease(1, 30000)
    result = await q.sync(
        enqueue=[entry("c1"), entry("c2")], ack=[(parent.id, parent.token)], lease=1
    )
    assert (result.added, result.acked, result.stale) == (2, 1, 0)
    assert payloads(result.leases) == [b"payload-c1"]
    assert (result.pending, result.leased) == (1, 1)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_reclaim_returns_expired_leases_in_their_order_and_fences_the_old_worker(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([entry("a"), entry("b", 3)])
    old = await q.lease(2, 50)
    await asyncio.sleep(0.1)
    assert (await q.reclaim(worker="w2", interval_ms=10000, batch=100, max_expiries=3))[:3] == (
        2,
        [],
        0,
    )
    assert await q.reclaim(worker="w3", interval_ms=10000, batch=100, max_expiries=3) is None
    new = await q.lease(2, 30000)
    assert payloads(new) == [b"payload-b", b"payload-a"]
    # the stale worker's renewal and ack are refused; the new worker's succeed
    renewed, lost = await q.renew(
        [(x.id, x.token) for x in old], worker="w1", lease_ms=30000, heartbeat_ms=30000
    )
    assert (renewed, sorted(lost)) == (0, sorted((x.id, x.token) for x in old))
    assert await q.ack([(x.id, x.token) for x in old]) == (0, 2)
    assert await q.ack([(x.id, x.token) for x in new]) == (2, 0)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_renew_keeps_a_lease_alive_and_registers_the_worker(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([entry("a")])
    (a,) = await q.lease(1, 200)
    pair = (a.id, a.token)
    # a renewal moves the lease's end (a long one: no stall of a loaded machine outlives it)
    for _ in range(2):
        assert await q.renew([pair], worker="w1", lease_ms=60_000, heartbeat_ms=60_000) == (1, [])
    assert (await q.counts()).workers == 1
    await asyncio.sleep(0.3)  # the first lease time (200 ms) is over: only the renewal holds
    await q.client.delete(KEYS.reclaim_guard)
    assert (await q.reclaim(worker="w2", interval_ms=1, batch=100, max_expiries=3))[:3] == (
        0,
        [],
        0,
    )
    assert await q.renew([pair], worker="w1", lease_ms=60_000, heartbeat_ms=200) == (1, [])
    assert await q.ack([pair]) == (1, 0)
    await asyncio.sleep(0.25)  # at least the last heartbeat's 200 ms
    assert (await q.counts()).workers == 0  # heartbeat expired
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_poison_after_max_expiries(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([entry("killer")])
    for round_ in range(3):
        (lease,) = await q.lease(1, 10)
        pair = (lease.id, lease.token)  # handed to the engine: its expiry counts
        await q.renew([pair], handed=[pair], worker="w", lease_ms=10, heartbeat_ms=1000)
        await asyncio.sleep(0.05)
        await q.client.delete(KEYS.reclaim_guard)
        reclaimed, poison, *_ = await q.reclaim(
            worker="w", interval_ms=1000, batch=10, max_expiries=3
        )
        assert (reclaimed, len(poison)) == ((1, 0) if round_ < 2 else (0, 1))
    counts = await q.counts()
    assert (counts.pending, counts.leased, counts.dead) == (0, 0, 1)
    info = json.loads(await q.client.hget(KEYS.dead_info, lease.id))
    assert (
        info["class"] == "poison" and info["expiries"] == 3 and "expired 3 times" in info["reason"]
    )
    assert await q.client.hget(KEYS.payload, lease.id) == b"payload-killer"  # kept for requeue
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_reclaim_batch_is_bounded(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([entry(str(i)) for i in range(7)])
    await q.lease(7, 1)
    await asyncio.sleep(0.05)
    assert (await q.reclaim(worker="w", interval_ms=10000, batch=5, max_expiries=3))[:3] == (
        5,
        [],
        0,
    )
    # a full batch lets the next round continue at once
    assert (await q.reclaim(worker="w", interval_ms=10000, batch=5, max_expiries=3))[:3] == (
        2,
        [],
        0,
    )
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_due_delayed_entries_are_promoted_with_their_priority(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([entry("later", 0), entry("first", 1)])
    (first,) = await q.lease(1, 30000)
    # park "first" in the delayed set as the retry issue does: due now, original score kept
    score = (await q.client.hget(KEYS.leases, first.id)).split()[1]
    await q.client.zadd(KEYS.delayed, {first.id: 0})
    await q.client.hset(KEYS.delayed_score, first.id, score)
    await q.client.zadd(KEYS.delayed, {"not-due": 2**50})
    await q.client.hset(KEYS.payload, "not-due", b"payload-not-due")
    leases = await q.lease(5, 30000)
    assert payloads(leases) == [b"payload-first", b"payload-later"]
    assert (await q.counts()).delayed == 1
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_release_puts_leases_back_in_front(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([entry("a"), entry("b"), entry("c")])
    a, b = await q.lease(2, 30000)
    assert await q.release([(a.id, a.token), (b.id, "stale")]) == 1
    assert payloads(await q.lease(5, 30000)) == [b"payload-a", b"payload-c"]
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_dead_letter_is_fenced_and_keeps_the_payload(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([entry("a")])
    (a,) = await q.lease(1, 30000)
    assert not await q.dead_letter(a.id, "stale", {"class": "corrupt", "reason": "x"})
    assert await q.dead_letter(a.id, a.token, {"class": "corrupt", "reason": "bad payload"}) == 1
    info = json.loads(await q.client.hget(KEYS.dead_info, a.id))
    assert info["reason"] == "bad payload" and info["first"] == info["last"] > 0
    counts = await q.counts()
    assert (counts.leased, counts.dead) == (0, 1)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_finish_clears_working_keys_only_for_the_last_worker(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([entry("a")])
    (a,) = await q.lease(1, 30000)
    await q.renew([], worker="w1", lease_ms=1000, heartbeat_ms=30000)
    await q.renew([], worker="w2", lease_ms=1000, heartbeat_ms=30000)
    assert not await q.finish("w1")  # work still leased
    await q.dead_letter(a.id, a.token, {"class": "gone", "reason": "404"})
    assert not await q.finish("w1")  # w2 is alive
    assert await q.finish("w2")
    assert not await q.client.exists(KEYS.dupefilter)
    assert (await q.counts()).dead == 1  # the dead-letter queue stays
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_crawl_cleared_by_one_worker_is_not_cleared_again_by_the_next(redis_url):
    """Two workers that left together both found no other heartbeat: the second cleared
    the cleared crawl again and said so too."""
    q = open_queue(redis_url)
    await q.renew([], worker="w1", lease_ms=1000, heartbeat_ms=30000)
    await q.renew([], worker="w2", lease_ms=1000, heartbeat_ms=30000)
    await q.leave("w1")
    await q.leave("w2")
    assert await q.finish("w1")
    assert not await q.finish("w2")
    # a worker whose heartbeat had expired, back (renewals do not join again): it crawled
    # on after the clear, and its keys would stay behind a 'done' for ever
    await q.renew([], worker="w3", lease_ms=1000, heartbeat_ms=30000)
    await q.enqueue([entry("late")])
    (late,) = await q.lease(1, 30000)
    await q.ack([(late.id, late.token)])
    await q.leave("w3")
    assert await q.client.exists(KEYS.dupefilter)
    assert await q.finish("w3")
    assert not await q.client.exists(KEYS.dupefilter)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_feed_takes_the_list_head_only_if_nobody_took_it_first(redis_url):
    q = open_queue(redis_url)
    await q.client.rpush("s:start_urls", b"u1", b"u2", b"u3")
    entries = [entry("u1", fp=b""), entry("u2", fp=b"")]
    assert await q.feed("s:start_urls", as_set=False, raw=[b"u2", b"u3"], entries=entries) == -1
    assert await q.feed("s:start_urls", as_set=False, raw=[b"u1", b"u2"], entries=entries) == 2
    assert await q.client.lrange("s:start_urls", 0, -1) == [b"u3"]
    bad = NewEntry(b"", 0, b"")  # an entry the spider could not read is dropped
    assert await q.feed("s:start_urls", as_set=False, raw=[b"u3"], entries=[bad]) == 0
    assert await q.client.llen("s:start_urls") == 0
    assert payloads(await q.lease(5, 30000)) == [b"payload-u1", b"payload-u2"]
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_garbage_in_counters_and_gates_does_not_stop_the_queue(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([entry("a")])
    await q.client.set(KEYS.seq, "not-a-number")
    await q.client.set(KEYS.lease_seq, "nope")
    await q.client.hset(KEYS.gates, "example.com", "not-a-time")
    assert await q.enqueue([entry("b")]) == 1  # the counter restarts above any id it gave
    result = await q.sync(lease=5)
    assert payloads(result.leases) == [b"payload-a", b"payload-b"]
    assert result.gates == {}  # (deleted when a lease meets its host: test_frontier_garbage)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_keys_of_the_wrong_type_are_set_aside(redis_url):
    q = open_queue(redis_url)
    await q.client.set(KEYS.delayed_score, "a string where a hash belongs")
    await q.client.hset(KEYS.ready, "x", "a hash where a sorted set belongs")
    moved = await q.set_aside_wrong_types()
    assert len(moved) == 2 and any("expected zset" in m for m in moved)
    assert len(await q.client.keys(KEYS.ready + ":corrupt:*")) == 1
    assert await q.enqueue([entry("a")]) == 1
    await q.client.aclose()


def test_the_sync_keys_are_built_once_and_handed_out_as_a_new_list():
    keys = Keys("ha", "built", 2, 4)
    first = sync_keys(keys, keys.buckets, "w1")
    assert first[0] == "ha:{built:2}:q:" and first[-1] == keys.grant("w1") and len(first) == 28
    first.append("a checkpoint key")  # what a caller adds is its own
    again = sync_keys(keys, keys.buckets, "w1")
    assert again == first[:-1] and again is not first
    assert sync_keys(keys, keys.buckets) == first[:-2]  # without a worker: no grant key
