"""A key of the wrong type makes a script fail before its first write, on a real
redis-server: the entry stays in the state it was in, and once the worker has set the key
aside, the same call succeeds (it is not refused as a stale lease)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.keys import Keys
from scrapy_ha.store import scripts
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import Commit, NewEntry
from tests import redis_servers

KEYS = Keys("ha", "wt")


@pytest.fixture(params=redis_servers.SCRIPT_PATHS)
def redis_url(request: pytest.FixtureRequest, redis_url: str) -> str:
    """Each test twice: the sync script as a Redis function, and with EVALSHA."""
    return redis_servers.script_path_url(redis_url, request.param)


PAGE = b'{"v":1,"u":"http://a.test/1"}'
RETENTION = {"max_entries": 100, "max_age_ms": 10**9}


async def leased(q: RedisQueue, lease_ms: int = 30000):
    await q.sync(enqueue=[NewEntry(b"", 0, PAGE)])
    (lease,) = (await q.sync(lease=1, lease_ms=lease_ms, promote=10)).leases
    return lease


async def fails_then_works(q: RedisQueue, call, bad_key: str):
    await q.client.set(bad_key, "garbage")
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        await call()
    moved = await q.set_aside_wrong_types()
    assert any(bad_key in m for m in moved)
    return await call()


@pytest.mark.parametrize("op", ["dead", "retry"])
@deferred_f_from_coro_f
async def test_an_ended_lease_stays_leased_until_its_op_can_run(redis_url, op):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    lease = await leased(q)

    async def call():
        if op == "dead":
            return await q.dead_letter(
                lease.id, lease.token, {"class": "http"}, payload=b"x", **RETENTION
            )
        return await q.retry_later(lease.id, lease.token, 1000, b"x")

    result = await fails_then_works(q, call, KEYS.dead if op == "dead" else KEYS.delayed)
    assert result  # not 0: the lease was still there, the op was not taken as stale
    counts = await q.counts()
    assert (counts.leased, counts.dead if op == "dead" else counts.delayed) == (0, 1)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_an_expired_lease_stays_until_reclaim_can_run(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    await leased(q, lease_ms=1)
    await asyncio.sleep(0.05)

    async def call():
        return await q.reclaim(worker="w", interval_ms=1, batch=10, max_expiries=3, **RETENTION)

    assert (await fails_then_works(q, call, KEYS.expiries))[0] == 1
    assert (await q.counts()).pending == 1
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_start_urls_stay_in_their_list_until_feed_can_run(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    start = "wt:start_urls"
    await q.client.rpush(start, "http://a.test/1")
    raw = await q.client.lrange(start, 0, 9)
    entries = [NewEntry(b"f1", 0, PAGE)]

    async def call():
        return await q.feed(start, as_set=False, raw=raw, entries=entries)

    await q.client.set(KEYS.dupefilter, "garbage")
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        await call()
    assert await q.client.llen(start) == 1  # not taken from the list
    await q.set_aside_wrong_types()
    assert await call() == 1
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_dead_entry_stays_dead_until_requeue_can_run(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    lease = await leased(q)
    assert await q.dead_letter(lease.id, lease.token, {"class": "http"}, **RETENTION)

    async def call():
        return await q.requeue_dead([(lease.id, 0, PAGE)])

    await q.client.set(KEYS.expiries, "garbage")
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        await call()
    assert (await q.counts()).dead == 1  # still dead-lettered, not in limbo
    await q.set_aside_wrong_types()
    assert await call() == 1
    assert (await q.counts()).pending == 1
    await q.client.aclose()


DOC = json.dumps({"task": "T", "of": 1, "page": 2, "items": 1, "done": False}).encode()


@pytest.mark.parametrize("bad", ["cp", "cpa"])
@deferred_f_from_coro_f
async def test_a_checkpoint_key_of_another_type_fails_the_ack_before_its_items(redis_url, bad):
    """The ack that carries the task's checkpoint fails before it adds its page's items,
    and the error names the key, which the worker sets aside: the call sent again adds
    the items once (it added them at every try, for ever, when it failed after them)."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    lease = await leased(q)
    pair = (lease.id, lease.token)
    key = KEYS.checkpoint("T") if bad == "cp" else KEYS.checkpoint_ahead("T")
    await q.client.sadd(key, "garbage")
    commits = {pair: Commit(items=(b"item-1", b"item-2"), checkpoint=("T", DOC, 60_000))}
    for _ in range(2):
        with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE") as info:
            await q.sync(ack=[pair], commits=commits)
        assert await q.client.xlen(KEYS.items) == 0  # nothing written
    assert await q.set_aside_wrong_types(str(info.value)) == [
        f"{key} (set, expected " + ("string)" if bad == "cp" else "hash)")
    ]
    result = await q.sync(ack=[pair], commits=commits)
    assert (result.acked, result.items, result.checkpoints) == (1, 2, 1)
    assert await q.client.xlen(KEYS.items) == 2
    assert json.loads(await q.client.get(KEYS.checkpoint("T")))["page"] == 2
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_checkpoint_key_of_another_type_is_set_aside_for_a_mid_page_save(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    lease = await leased(q)

    async def call():
        return await q.save_checkpoint(lease.id, lease.token, "T", DOC, 60_000)

    await q.client.hset(KEYS.checkpoint("T"), "x", "y")
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE") as info:
        await call()
    assert await q.set_aside_wrong_types(str(info.value)) == [
        f"{KEYS.checkpoint('T')} (hash, expected string)"
    ]
    assert await call()
    assert json.loads(await q.client.get(KEYS.checkpoint("T")))["page"] == 2
    await q.client.aclose()


@pytest.mark.parametrize("bad", ["ready", "waiting"])
@deferred_f_from_coro_f
async def test_back_queues_are_leased_again_once_the_key_naming_them_is_set_aside(redis_url, bad):
    """A QA run: `ready` overwritten by a string mid-crawl was set aside, and the 15
    requests of its back queues stayed in Redis out of every lease's reach: the crawl
    finished without them."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        await _leased_again(q, bad)
    finally:
        await q.client.aclose()


async def _leased_again(q: RedisQueue, bad: str) -> None:
    pages = [b'{"v":1,"u":"http://a.test/%d"}' % i for i in range(3)]
    await q.sync(enqueue=[NewEntry(b"", 0, page) for page in pages])
    if bad == "waiting":  # the back queue parked (its host at its limits)
        (qid,) = await q.client.zrange(KEYS.ready, 0, -1)
        await q.client.zrem(KEYS.ready, qid)
        await q.client.zadd(KEYS.waiting, {qid: 1})
    await q.client.delete(getattr(KEYS, bad))
    await q.client.set(getattr(KEYS, bad), "garbage")
    moved = await q.set_aside_wrong_types()
    assert any(getattr(KEYS, bad) in m for m in moved)
    leases = (await q.sync(lease=10, promote=10)).leases
    assert sorted(lease.payload for lease in leases) == sorted(pages)


@deferred_f_from_coro_f
async def test_a_held_count_holding_garbage_starts_again(redis_url):
    """A QA run: ``HSET ha:{qa}:held "#revisit 127.0.0.1" abc``; every call that moved an
    entry of that domain failed ("hash value is not an integer"), and no revisit of it
    went through. The count starts again; the entry is deferred and marked."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        lease = await leased(q)
        await q.client.hset(KEYS.held, "#gate a.test", "abc")
        assert await q.retry_later(lease.id, lease.token, 60_000, PAGE, held="gate")
        assert await q.client.hget(KEYS.held, lease.id) == b"gate a.test"
        assert await q.client.hget(KEYS.held, "#gate a.test") == b"1"
    finally:
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_times_no_worker_sets_are_taken_as_garbage(redis_url):
    """A QA run: ``ZADD ha:{qa}:leased <id> inf`` left a lease that never expired, and the
    crawl idled for ever (``leased 1``, no worker); a delayed entry timed ``inf`` was never
    due; a heartbeat of ``inf`` was a live worker for ever (flush refused). The lease
    expires at the next reclaim, the entry is due, the heartbeat goes at the next renewal."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        lease = await leased(q)
        await q.client.zadd(KEYS.leased, {lease.id: float("inf")})
        later = await leased(q)
        assert await q.retry_later(later.id, later.token, 60_000, PAGE, failure_class="server")
        await q.client.zadd(KEYS.delayed, {later.id: 1e300})
        near = await leased(q)  # a lease past the longest HA_LEASE_TIME (1e12 ms) is garbage
        await q.client.zadd(KEYS.leased, {near.id: time.time() * 1000 + 1e13})
        far = await leased(q)  # 1e15 ms ahead is no garbage (a revisit waits 1e13 at most)
        assert await q.retry_later(far.id, far.token, 10**15, PAGE, failure_class="server")
        await q.client.zadd(KEYS.workers, {"ghost": float("inf")})
        reclaimed = await q.reclaim(worker="w", interval_ms=1, batch=10, max_expiries=3)
        assert reclaimed is not None and reclaimed.reclaimed == 2
        assert len((await q.sync(lease=5, promote=5)).leases) == 3  # and the delayed, due
        assert (await q.counts()).delayed == 1  # the far one waits
        await q.renew([], worker="w", lease_ms=30_000, heartbeat_ms=30_000)
        assert await q.client.zscore(KEYS.workers, "ghost") is None
    finally:
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_the_feed_guard_a_string_is_not_set_aside(redis_url):
    """A review: the feed guard (SET NX PX) was typed a hash: a set-aside renamed it, and a
    second feed could then run while the first one held it."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        await q.client.set(KEYS.feed_guard, "w1", px=60_000)
        assert not any(KEYS.feed_guard in m for m in await q.set_aside_wrong_types())
        assert await q.client.get(KEYS.feed_guard) == b"w1"
    finally:
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_the_keepers_stop_lets_a_set_aside_finish(redis_url):
    """A review: the stop cancelled it, between the rename of `ready` and the relink of its
    back queues (two steps), which left them out of every lease's reach."""
    from scrapy.settings import Settings

    from scrapy_ha.scheduler.session.renewal import Renewals

    done = []

    async def slow(exc: Exception) -> None:
        await asyncio.sleep(0.3)
        done.append(exc)

    renewals = Renewals(Settings(), lambda: None, tuple, lambda lost: None, on_bad_data=slow)
    renewals._on_wrong_type(redis.exceptions.ResponseError("WRONGTYPE renew: k"))
    await asyncio.sleep(0.05)
    await renewals.stop_keeper(timeout=30)
    assert done


def test_the_checkpoint_pattern_escapes_the_prefix(redis_client):
    """A review: prefix `h?` matched the checkpoints of prefix `ha`."""
    redis_client.set("ha:{books}:cp:t1", "x")
    try:
        assert not list(redis_client.scan_iter(match=Keys("h?", "books").checkpoint_pattern))
        assert list(redis_client.scan_iter(match=Keys("ha", "books").checkpoint_pattern))
    finally:
        redis_client.delete("ha:{books}:cp:t1")


@deferred_f_from_coro_f
async def test_a_failed_set_aside_asked_by_the_keeper_is_said(caplog):
    """A review: the task was never awaited ("Task exception was never retrieved")."""
    import logging

    from scrapy.settings import Settings

    from scrapy_ha.scheduler.session.renewal import Renewals

    async def failing(exc: Exception) -> None:
        raise redis.exceptions.ConnectionError("gone")

    renewals = Renewals(Settings(), lambda: None, tuple, lambda lost: None, on_bad_data=failing)
    with caplog.at_level(logging.WARNING):
        renewals._on_wrong_type(redis.exceptions.ResponseError("WRONGTYPE renew: k"))
        await asyncio.sleep(0.05)
    assert "Setting aside a key the renewals could not read failed" in caplog.text


@pytest.mark.parametrize("then", ["start", "finish"])
@deferred_f_from_coro_f
async def test_a_relink_owed_by_a_worker_that_stopped_is_done_by_the_next(redis_url, then):
    """A review: the rename of `ready` and the relink of its back queues are two steps; a
    worker stopped between them left the requests out of every lease's reach, and the next
    worker's finish cleared the crawl. The rename marks the relink owed, in its own step:
    the next worker's start (its set-aside) or finish does it."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        await q.sync(enqueue=[NewEntry(b"", 0, PAGE)])
        await q.client.delete(KEYS.ready)
        await q.client.set(KEYS.ready, "garbage")
        types = {KEYS.ready: "zset!", KEYS.waiting: "zset!", KEYS.ready + ":relink": "marker"}
        await q._set_aside(keys=list(types), args=list(types.values()))  # then it stopped
        assert await q.client.exists(KEYS.ready + ":relink")
        if then == "start":
            await q.set_aside_wrong_types()  # nothing of another type left: the marker
        else:
            assert not (await q.finish("w2")).done  # the crawl holds a request
        assert len((await q.sync(lease=5, promote=5)).leases) == 1
        assert not await q.client.exists(KEYS.ready + ":relink")
    finally:
        await q.client.aclose()


async def _orphaned(q: RedisQueue, keys: Keys) -> None:
    """A request in a back queue that no key names, and its relink marked owed (the worker
    that set `ready` aside stopped before its relink)."""
    await q.sync(enqueue=[NewEntry(b"", 0, PAGE)])
    await q.client.delete(keys.ready)
    await q.client.set(keys.ready, "garbage")
    types = {keys.ready: "zset!", keys.waiting: "zset!", keys.ready + ":relink": "marker"}
    await q._set_aside(keys=list(types), args=list(types.values()))


@deferred_f_from_coro_f
async def test_a_relink_deletes_the_mark_only_if_no_rename_came_since(redis_url):
    """A review: a second rename between a relink's read of the mark and its end was
    forgotten (the mark deleted), and its queues stayed out of reach."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        await _orphaned(q, KEYS)
        marker = KEYS.ready + ":relink"
        assert await q.client.get(marker) == b"1"
        await q.client.incr(marker)  # a second rename, after the relink read "1"
        relink = q.client.register_script(scripts.RELINK_LUA)
        await relink(keys=[KEYS.ready, KEYS.waiting, marker], args=["1"])
        assert await q.client.get(marker) == b"2"  # still owed
        await relink(keys=[KEYS.ready, KEYS.waiting, marker], args=["2"])
        assert not await q.client.exists(marker)
    finally:
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_close_that_finds_a_relink_owed_does_not_end_the_run(redis_url, caplog):
    """A review: the last worker's close ended the run ("finished") and only then found
    the back queues no key named; the run now stays open for the next worker."""
    from scrapy_ha.config.scheduler import SchedulerConfig
    from scrapy_ha.scheduler.session.closing import wind_up

    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        await _orphaned(q, KEYS)
        await wind_up(q, 1, SchedulerConfig())
        assert "Run 1 of the crawl did not finish" in caplog.text
        assert len((await q.sync(lease=5, promote=5)).leases) == 1
    finally:
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_persisted_sharded_finish_does_a_relink_owed_on_every_shard(redis_url):
    """A review: with SCHEDULER_PERSIST the sharded finish looked at shard 0's alone."""
    from scrapy_ha.store.sharding import make_queue

    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        sharded = make_queue(client, "ha", "sk", 2)
        shard = sharded.shards[1]
        await _orphaned(shard, shard.keys)
        assert not (await sharded.finish("w2", keep=True)).done
        assert await client.zcard(shard.keys.waiting) == 1
    finally:
        names = [key async for key in client.scan_iter(match="ha:{sk*")]
        if names:
            await client.delete(*names)
        await client.aclose()


@deferred_f_from_coro_f
async def test_a_relink_mark_holding_garbage_fails_no_set_aside(redis_url):
    """The mark is counted with INCR: garbage there failed the script after its renames."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        await q.sync(enqueue=[NewEntry(b"", 0, PAGE)])
        await q.client.set(KEYS.ready + ":relink", "abc")
        await q.client.delete(KEYS.ready)
        await q.client.set(KEYS.ready, "garbage")
        assert any(KEYS.ready in m for m in await q.set_aside_wrong_types())
        assert len((await q.sync(lease=5, promote=5)).leases) == 1
    finally:
        await q.client.aclose()
