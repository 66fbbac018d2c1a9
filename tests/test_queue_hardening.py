"""Scripts against garbage, stale tokens and zombie parents, on a real redis-server: each
script applies whole or not at all, sets garbage aside with a reason, never gives the same
token twice, and refuses the children of a page whose lease is gone."""

from __future__ import annotations

import asyncio
import json

import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry

KEYS = Keys("ha", "h")
PRIO = 2**40


def entry(name: str, priority: int = 0, fp: bytes | None = None, parent=None) -> NewEntry:
    fingerprint = name.encode() if fp is None else fp
    return NewEntry(fingerprint, priority, f"payload-{name}".encode(), parent)


def open_queue(url: str, order: str = "fifo") -> RedisQueue:
    return RedisQueue(redis.asyncio.Redis.from_url(url), KEYS, order=order)


async def expire(q: RedisQueue) -> None:
    """Let every lease expire (they are 50 ms long in these tests)."""
    await asyncio.sleep(0.1)


@deferred_f_from_coro_f
async def test_reclaim_sets_aside_an_unreadable_lease_record_and_keeps_its_payload(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([entry("a"), entry("b")])
    a, b = await q.lease(2, 50)
    await q.client.hset(KEYS.leases, a.id, f"{a.token} not-a-number")
    await expire(q)
    result = await q.reclaim(worker="w", interval_ms=1000, batch=10, max_expiries=3)
    # b back to pending, a set aside: nothing half-done
    assert result is not None and result[:3] == (1, [], 1)
    info = json.loads(await q.client.hget(KEYS.dead_info, a.id))
    assert info["class"] == "corrupt" and "lease record" in info["reason"]
    assert await q.client.hget(KEYS.payload, a.id) == b"payload-a"  # kept for the operator
    counts = await q.counts()
    assert (counts.pending, counts.leased, counts.dead) == (1, 0, 1)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_sync_sets_aside_a_pending_member_without_id_and_applies_whole(redis_url):
    q = open_queue(redis_url)
    # an element without an entry id at the head of the best back queue
    await q.client.rpush(KEYS.queue("0:-"), b" garbage-without-id")
    await q.client.zadd(KEYS.ready, {"0:-": -10})
    await q.enqueue([entry("a")])
    # a dont_filter child enqueued in the same call as the lease of the garbage
    result = await q.sync(enqueue=[entry("child", fp=b"")], lease=5, lease_ms=30000)
    assert result.added == 1 and result.set_aside == 1
    assert sorted(lease.payload for lease in result.leases) == [b"payload-a", b"payload-child"]
    assert all(lease.id for lease in result.leases)
    acked = await q.sync(ack=[(lease.id, lease.token) for lease in result.leases])
    assert (acked.acked, acked.stale) == (2, 0)
    (dead_id,) = await q.client.zrange(KEYS.dead, 0, -1)
    assert json.loads(await q.client.hget(KEYS.dead_info, dead_id))["class"] == "corrupt"
    assert await q.client.hget(KEYS.payload, dead_id) == b" garbage-without-id"
    counts = await q.counts()
    assert (counts.pending, counts.leased) == (0, 0)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_sync_refuses_a_malformed_ack_without_failing(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([entry("a")])
    (a,) = await q.lease(1, 30000)
    result = await q.sync(enqueue=[entry("b", fp=b"")], ack=[("", "x"), (a.id, a.token)])
    assert (result.added, result.acked, result.stale) == (1, 1, 1)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_promotion_survives_an_unreadable_restore_score(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([entry("a")])
    (a,) = await q.lease(1, 30000)
    assert await q.retry_later(a.id, a.token, 0, b"payload-a2")
    await q.client.hset(KEYS.delayed_score, a.id, "junk")
    result = await q.sync(enqueue=[entry("b")], lease=5)
    assert sorted(lease.payload for lease in result.leases) == [b"payload-a2", b"payload-b"]
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_stale_token_from_before_a_flush_is_refused_after_it(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([entry("a")])
    (old,) = await q.lease(1, 30000)
    await q.flush()  # a new crawl: every counter starts again
    await q.enqueue([entry("a")])
    (new,) = await q.lease(1, 30000)
    assert new.id == old.id and new.token != old.token
    assert await q.ack([(old.id, old.token)]) == (0, 1)  # the frozen worker's ack is refused
    assert await q.ack([(new.id, new.token)]) == (1, 0)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_tokens_differ_even_when_the_token_counter_rolls_back(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([entry("a"), entry("b")])
    (a,) = await q.lease(1, 30000)
    await q.client.delete(KEYS.lease_seq)  # a failover that lost the counter's last writes
    (b,) = await q.lease(1, 30000)
    assert a.token != b.token
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_children_of_a_page_whose_lease_is_gone_are_refused(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([entry("page")])
    (page,) = await q.lease(1, 50)
    parent = (page.id, page.token)
    result = await q.sync(enqueue=[entry("c1", parent=parent)])
    assert (result.added, result.refused) == (1, 0)  # lease current: enqueued
    await expire(q)
    await q.reclaim(worker="w", interval_ms=1000, batch=10, max_expiries=3)
    result = await q.sync(
        enqueue=[entry("c2", parent=parent), entry("c3", fp=b"", parent=parent), entry("root")]
    )
    assert (result.added, result.refused) == (1, 2)
    assert not await q.client.sismember(KEYS.dupefilter, b"c2")  # the dupefilter is untouched
    assert await q.client.sismember(KEYS.dupefilter, b"c1")
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_retry_comes_back_with_its_lowered_priority_and_its_place(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([entry("r1"), entry("r2")])
    r1, r2 = await q.lease(2, 30000)
    await q.enqueue([entry("fresh1"), entry("fresh2")])
    assert await q.retry_later(r2.id, r2.token, 0, b"", priority=-1)
    assert await q.retry_later(r1.id, r1.token, 0, b"", priority=-1)
    await q.enqueue([entry("low", -1)])
    leases = await q.lease(10, 30000)
    # fresh work first; among the lowered retries, their original order; then newer work
    assert [lease.payload for lease in leases] == [
        b"payload-fresh1",
        b"payload-fresh2",
        b"payload-r1",
        b"payload-r2",
        b"payload-low",
    ]
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_retry_without_priority_keeps_its_score(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([entry("r")])
    (r,) = await q.lease(1, 30000)
    await q.enqueue([entry("fresh")])
    assert await q.retry_later(r.id, r.token, 0, b"")
    leases = await q.lease(10, 30000)
    assert [lease.payload for lease in leases] == [b"payload-r", b"payload-fresh"]
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_every_script_clamps_priorities(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([entry("d")])
    (d,) = await q.lease(1, 30000)
    await q.dead_letter(d.id, d.token, {"class": "x"})
    assert await q.requeue_dead([(d.id, 9000, b"payload-d")]) == 1
    # back in the queue of its host ("-": no URL) at the highest priority, at a new place
    place = int(await q.client.get(KEYS.seq))
    assert await q.client.lrange(KEYS.queue("4095:-"), 0, -1) == [
        b"%s@%d payload-d" % (d.id.encode(), place)
    ]
    assert await q.client.zscore(KEYS.ready, "4095:-") == -4095 * PRIO + place
    await q.client.rpush("h:start_urls", b"u")
    added = await q.feed(
        "h:start_urls", as_set=False, raw=[b"u"], entries=[NewEntry(b"", -9000, b"payload-u")]
    )
    assert added == 1
    (element,) = await q.client.lrange(KEYS.queue("-4095:-"), 0, -1)
    score = await q.client.zscore(KEYS.ready, "-4095:-")
    assert element.endswith(b"payload-u") and score == 4095 * PRIO + int(element.split()[0])
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_lifo_and_fifo_within_a_priority(redis_url):
    for order, expected in (
        ("fifo", [b"payload-a", b"payload-b", b"payload-c"]),
        ("lifo", [b"payload-c", b"payload-b", b"payload-a"]),
    ):
        q = open_queue(redis_url, order)
        await q.flush()
        await q.enqueue([entry("a"), entry("b")])
        await q.enqueue([entry("c"), entry("top", 1)])
        leases = await q.lease(10, 30000)
        assert [lease.payload for lease in leases] == [b"payload-top", *expected], order
        # released and reclaimed entries keep their place
        await q.release([(lease.id, lease.token) for lease in leases])
        again = await q.lease(10, 30000)
        assert [lease.payload for lease in again] == [b"payload-top", *expected], order
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_the_poison_path_keeps_the_dead_letter_retention(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([entry(str(i)) for i in range(5)])
    for _ in range(3):
        pairs = [(lease.id, lease.token) for lease in await q.lease(5, 50)]
        await q.renew(pairs, handed=pairs, worker="w", lease_ms=50, heartbeat_ms=1000)
        await expire(q)
        result = await q.reclaim(worker="w", interval_ms=1, batch=10, max_expiries=3, max_entries=2)
    assert len(result.poison) == 5
    assert await q.client.zcard(KEYS.dead) == 2
    assert await q.client.hlen(KEYS.dead_info) == 2
    await q.client.aclose()
