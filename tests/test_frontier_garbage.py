"""Garbage in the frontier's data never fails a call half-way. A back-queue element as
enqueued (no place written) whose id is not a whole number is set aside as corrupt, like
one without an id. Before: its id text became its score, and the lease's ZADD of it back to
the ready set failed half-way through the call, after the queue was trimmed: the requests
taken in that call were gone, with no dead letter. Ready entries of deleted queues are
dropped a bounded number per call; gates and limits' state that are not finite numbers
('nan', 'inf': Lua's tonumber reads both) are deleted or start again."""

from __future__ import annotations

import pytest
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.config.politeness import DomainLimit, Politeness
from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.state import set_domain_limits
from scrapy_ha.store.wire import NewEntry

KEYS = Keys("ha", "garbage")


@pytest.mark.parametrize("garbage", ["abc", "nan", "0x1", "1e5"])
@deferred_f_from_coro_f
async def test_an_element_id_that_is_not_a_number_is_set_aside(redis_url, redis_client, garbage):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        key = KEYS.queue("0:x")
        redis_client.rpush(key, *[f'{garbage}{n} {{"v":1,"u":"http://x/{n}"}}' for n in "123"])
        redis_client.rpush(key, '7 {"v":1,"u":"http://x/7"}')  # a good one behind them
        redis_client.zadd(KEYS.ready, {"0:x": 0})
        result = await q.sync(lease=2)
        assert [lease.id for lease in result.leases] == ["7"]
        assert result.set_aside == 3
        assert redis_client.zcard(KEYS.dead) == 3
        assert redis_client.llen(key) == 0
    finally:
        await q.client.aclose()


def page(host: str, n: int) -> NewEntry:
    payload = b'{"v":1,"u":"http://%s/%d"}' % (host.encode(), n)
    return NewEntry(b"%s/%d" % (host.encode(), n), 0, payload, host=host)


@deferred_f_from_coro_f
async def test_ready_entries_of_deleted_queues_cost_each_call_a_bounded_part(
    redis_url, redis_client
):
    """Entries of ready whose back queue was deleted behind the index (by hand, an eviction,
    a flush while workers run). Before: the lease read them all in one call, recursing once
    per batch: 25,000 overflowed Lua's stack after the call's enqueue was written (its
    count lost), and every call after it failed the same way."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        await q.enqueue([page("z.test", 1)])
        pipe = redis_client.pipeline(transaction=False)
        for start in range(0, 25000, 5000):
            pipe.zadd(KEYS.ready, {f"0:h{j}.test": 0 for j in range(start, start + 5000)})
        pipe.execute()
        first = await q.sync(enqueue=[page("y.test", 1)], lease=16)
        assert first.added == 1 and first.leases == []  # the 256 first are dropped, no more
        assert redis_client.zcard(KEYS.ready) == 25002 - 256
        assert int(redis_client.get(KEYS.queued)) == 2  # the enqueue's count is kept
        got, calls = [], 1
        while len(got) < 2:
            got += [lease.payload for lease in (await q.sync(lease=16)).leases]
            calls += 1
            assert calls <= 25000 // 256 + 2
        assert sorted(got) == [page("y.test", 1).payload, page("z.test", 1).payload]
        assert int(redis_client.hget(KEYS.stats, "queues_gone")) == 25000
        assert redis_client.zcard(KEYS.ready) == 0
    finally:
        await q.client.aclose()


async def limited(q: RedisQueue, limit: DomainLimit) -> None:
    await set_domain_limits(q.client, KEYS, Politeness(limit, {}).as_hash())


@pytest.mark.parametrize("garbage", ["nan", "inf", "-nan", "1e999"])
@deferred_f_from_coro_f
async def test_a_gate_that_is_not_a_finite_number_is_deleted(redis_url, redis_client, garbage):
    """Before: 'nan' failed the call after the queue left ready (in neither ready nor
    waiting) and every sync after it failed in the worker (int(b'nan')); 'inf' parked the
    host for ever."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        await q.enqueue([page("d.test", n) for n in range(3)] + [page("e.test", 1)])
        redis_client.hset(KEYS.gates, "d.test", garbage)
        result = await q.sync(lease=10)
        assert len(result.leases) == 4 and result.gates == {}
        assert redis_client.hgetall(KEYS.gates) == {}
    finally:
        await q.client.aclose()


@pytest.mark.parametrize(
    ("field", "garbage", "limit", "leased"),
    [
        ("t:d.test", "inf", DomainLimit(rate=10), 3),  # before: parked for ever
        ("n:d.test", "inf", DomainLimit(concurrency=2), 2),  # before: parked for ever
        ("n:d.test", "nan", DomainLimit(concurrency=1), 1),  # before: no limit (3 leased)
        ("n:d.test", "-inf", DomainLimit(concurrency=1), 1),  # before: no limit (3 leased)
        ("n:d.test", "-5", DomainLimit(concurrency=1), 1),  # before: 3 leased (6 allowed)
    ],
)
@deferred_f_from_coro_f
async def test_a_limits_state_that_is_not_a_finite_number_starts_again(
    redis_url, redis_client, field, garbage, limit, leased
):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        await limited(q, limit)
        await q.enqueue([page("d.test", n) for n in range(3)])
        redis_client.hset(KEYS.polite, field, garbage)
        result = await q.sync(lease=10)
        assert len(result.leases) == leased
        assert all(lease.wait_ms <= 1000 for lease in result.leases)
        if limit.concurrency:
            assert redis_client.hget(KEYS.polite, field) == str(leased).encode()
    finally:
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_revisits_set_that_is_not_a_sorted_set_fails_no_promotion(redis_url, redis_client):
    """The promotion dates the revisits it promotes in ``ha:{S}:revisits``, a key the sync
    script names from the back queues' prefix and does not check: one holding garbage (a
    string) failed the call half-way (WRONGTYPE), its entries promoted but their restore
    records and payloads left behind, nothing leased, at every round that promoted."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        await q.enqueue(
            [NewEntry(f"e{n}".encode(), 0, b'{"v":1,"u":"http://x/%d"}' % n) for n in (1, 2)]
        )
        for lease in (await q.sync(lease=2)).leases:
            assert await q.retry_later(
                lease.id, lease.token, 0, lease.payload, failure_class="server"
            )
        redis_client.set(KEYS.revisits, "garbage")
        result = await q.sync(lease=2, promote=10)
        assert len(result.leases) == 2
        assert redis_client.hlen(KEYS.delayed_score) == 0
        assert redis_client.get(KEYS.revisits) == b"garbage"
    finally:
        await q.client.aclose()
