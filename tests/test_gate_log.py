"""The gates a sync returns (gate.lua's log, sync.lua's KEYS[27], store/gate_log.py): only
those changed since the number the worker last saw. Before, every call read the whole
gates hash and returned every closed gate: at 1,000 closed gates a round cost Redis 5.8
times its instructions without them (bench/script_cost.py --gates 1000), every round of
every worker."""

from __future__ import annotations

import time

import redis.asyncio
from scrapy import Request
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.domains import ClosedDomains
from scrapy_ha.scheduler.remote import Remote
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.sharding import make_queue
from scrapy_ha.store.wire import NewEntry, SyncResult

KEYS = Keys("ha", "glog")


def page(host: str, n: int) -> NewEntry:
    payload = b'{"v":1,"u":"http://%s/%d"}' % (host.encode(), n)
    return NewEntry(b"%s/%d" % (host.encode(), n), 0, payload, host=host)


def open_queue(url: str) -> RedisQueue:
    return RedisQueue(redis.asyncio.Redis.from_url(url), KEYS)


@deferred_f_from_coro_f
async def test_a_sync_returns_the_gates_changed_since_the_workers_last_call(redis_url):
    q = open_queue(redis_url)
    other = open_queue(redis_url)  # another worker, which closes the gates
    try:
        for n in range(3):
            await other.close_gate(f"g{n}.test", 600_000)
        first = await q.sync()
        assert set(first.gates) == {"g0.test", "g1.test", "g2.test"}
        assert (await q.sync()).gates == {}  # before: the three again, every call
        await other.close_gate("g1.test", 900_000)  # longer: a change
        await other.close_gate("g2.test", 1_000)  # shorter: no change (never shortened)
        await other.close_gate("g3.test", 600_000)
        third = await q.sync()
        assert set(third.gates) == {"g1.test", "g3.test"}
        assert third.gates["g1.test"] > first.gates["g1.test"]
        # what the worker's round takes: every change since its last take, once
        news, every = q.take_gates()
        assert set(news) == {"g0.test", "g1.test", "g2.test", "g3.test"} and not every
        assert q.take_gates() == ({}, False)
        # a new worker learns every gate closed now
        new = open_queue(redis_url)
        assert set((await new.sync()).gates) == set(news)
        await new.client.aclose()
    finally:
        await q.client.aclose()
        await other.client.aclose()


@deferred_f_from_coro_f
async def test_a_log_lost_with_its_redis_gives_every_gate_again(redis_url, redis_client):
    q = open_queue(redis_url)
    try:
        await q.close_gate("old.test", 600_000)
        await q.sync()
        q.take_gates()
        # Redis restarted without its data; its clock is behind (a replica's), so the new
        # log's numbers are below the one the worker holds
        redis_client.delete(KEYS.gates, KEYS.gate_log)
        await q.close_gate("new.test", 600_000)
        redis_client.zadd(KEYS.gate_log, {"=": 5, "new.test": 5})
        result = await q.sync()
        assert set(result.gates) == {"new.test"}
        news, every = q.take_gates()
        assert set(news) == {"new.test"} and every  # every gate: old.test is gone
        assert (await q.sync()).gates == {}  # and from then on, the changes again
        # a log lost and started again later than the worker's number: its changes
        redis_client.delete(KEYS.gates, KEYS.gate_log)
        await q.close_gate("later.test", 600_000)
        assert set((await q.sync()).gates) == {"later.test"}
    finally:
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_the_gates_that_opened_leave_the_hash_and_the_log(redis_url, redis_client):
    q = open_queue(redis_url)
    try:
        for n in range(20):
            await q.close_gate(f"short{n}.test", 1)
        await q.close_gate("long.test", 600_000)
        time.sleep(0.01)
        await q.close_gate("next.test", 600_000)  # each close sweeps the log's oldest 16
        await q.close_gate("last.test", 600_000)
        gates = {k.decode() for k in redis_client.hkeys(KEYS.gates)}
        logged = {m.decode() for m in redis_client.zrange(KEYS.gate_log, 0, -1)}
        assert gates == {"long.test", "next.test", "last.test"}
        assert logged == gates | {"="}
    finally:
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_gated_host_is_held_back_without_the_gates_in_the_reply(redis_url):
    q = open_queue(redis_url)
    try:
        await q.close_gate("gated.test", 600_000)
        await q.sync()  # the worker's number: the gate is not in the next replies
        await q.enqueue([page("gated.test", n) for n in range(3)] + [page("free.test", 1)])
        result = await q.sync(lease=10)
        assert result.gates == {}
        assert [lease.payload for lease in result.leases] == [b'{"v":1,"u":"http://free.test/1"}']
    finally:
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_sharded_crawl_takes_each_shards_changes(redis_url):
    client = redis.asyncio.Redis.from_url(redis_url)
    q = make_queue(client, "ha", "glogs", 3, worker="w1")
    try:
        await q.close_gate("a.test", 600_000)
        await q.sync(lease=1)
        news, every = q.take_gates()
        assert set(news) == {"a.test"} and not every
        await q.sync(lease=1)
        assert q.take_gates() == ({}, False)
    finally:
        await client.aclose()


def test_the_worker_merges_the_changes_and_forgets_the_gates_that_opened():
    closed = ClosedDomains()
    now = time.monotonic()
    closed.learn({"a.test": now + 60, "b.test": now - 1}, every=False)
    closed.learn({"c.test": now + 60}, every=False)  # before: a reply replaced the map
    assert set(closed.until) == {"a.test", "c.test"}  # b.test had opened: swept
    assert closed.wait(Request("http://a.test/x")) > 0
    closed.learn({"c.test": now + 30}, every=False)  # Redis's later word (GateLog's order)
    assert closed.until["c.test"] == now + 30
    closed.learn({"d.test": now + 60}, every=True)  # Redis lost its log: only its gates
    assert set(closed.until) == {"d.test"}


@deferred_f_from_coro_f
async def test_the_log_is_of_its_type_and_one_of_another_is_set_aside(redis_url, redis_client):
    q = open_queue(redis_url)
    try:
        await q.close_gate("a.test", 600_000)
        assert await q.set_aside_wrong_types() == []  # before: the log renamed aside
        assert redis_client.exists(KEYS.gate_log)
        redis_client.delete(KEYS.gate_log)
        redis_client.set(KEYS.gate_log, "garbage")
        await q.close_gate("c.test", 600_000)  # before: WRONGTYPE, after the gate's write
        assert redis_client.hexists(KEYS.gates, "c.test")
        assert [m.split()[0] for m in await q.set_aside_wrong_types()] == [KEYS.gate_log]
        await q.close_gate("b.test", 600_000)
        assert "b.test" in (await q.sync()).gates
    finally:
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_log_restored_from_an_older_copy_reuses_no_number(redis_url, redis_client):
    """A restart from the last snapshot, or a failover to a replica behind the primary,
    restores a log whose last number is below the one a worker holds. Before, the next
    closes took the numbers the worker had already seen, and no sync returned them."""
    q = open_queue(redis_url)
    try:
        await q.close_gate("g1.test", 600_000)
        await q.sync()
        held = q.gate_log.number
        redis_client.zadd(KEYS.gate_log, {"=": held - 2})  # the copy the server came back with
        await q.close_gate("g4.test", 600_000)
        await q.close_gate("g5.test", 600_000)
        assert {"g4.test", "g5.test"} <= set((await q.sync()).gates)
    finally:
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_garbage_last_number_does_not_freeze_the_log(redis_url, redis_client):
    q = open_queue(redis_url)
    try:
        redis_client.zadd(KEYS.gate_log, {"=": 2**60})  # + 1 adds nothing to it
        await q.sync()
        await q.close_gate("new0.test", 600_000)
        assert set((await q.sync()).gates) == {"new0.test"}  # before: nothing, for ever
        await q.close_gate("new1.test", 600_000)
        assert set((await q.sync()).gates) == {"new1.test"}
    finally:
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_one_shard_losing_its_log_does_not_open_the_others_gates(redis_url, redis_client):
    client = redis.asyncio.Redis.from_url(redis_url)
    q = make_queue(client, "ha", "glost", 2, worker="w1")
    try:
        await q.close_gate("x.test", 600_000)  # closed in both shards
        await q.sync(lease=1)
        await q.sync(lease=1)  # (each round leases from the next shard)
        assert set(q.take_gates()[0]) == {"x.test"}
        one = Keys("ha", "glost", 1, 2)
        redis_client.delete(one.gates, one.gate_log)  # shard 1's data lost
        await q.sync(lease=1)
        await q.sync(lease=1)
        news, every = q.take_gates()
        # before: every gate (shard 1's none), and the worker forgot x.test, still closed
        # in shard 0, for good; now every shard is asked for its gates again
        assert not every
        await q.sync(lease=1)
        await q.sync(lease=1)
        assert "x.test" in {**news, **q.take_gates()[0]}
    finally:
        await client.aclose()


def test_a_reply_without_a_clock_leaves_the_servers_clock_as_it_was():
    """A sharded round that called no shard replies now_ms 0. Before, the worker then took
    Redis's clock for 1970 (server_time_ms near 0: revisits timed by it), and the gates the
    round's earlier calls brought opened 57 years late."""
    remote = Remote()
    remote.clock(SyncResult(1_800_000_000_000, 0, 0, 0, 0, 0, 0))
    offset = remote.server_offset_ms
    remote.clock(SyncResult(0, 0, 0, 0, 0, 0, 0))
    assert remote.server_offset_ms == offset
