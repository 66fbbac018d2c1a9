"""Garbage in a dead-letter record, or in the dead-letter queue's keys, never fails a call
half-way: a script checks what it will write before its first write, and a reader falls
back on what it can read. A real redis-server."""

from __future__ import annotations

import json

import pytest
import redis
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.config.politeness import DomainLimit, Politeness
from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.script_keys import dead_keys
from scrapy_ha.store.state import set_domain_limits
from scrapy_ha.store.wire import NewEntry
from scrapy_ha.verdict import Verdict
from tests.test_dlq import cli

KEYS = Keys("ha", "dlqgarbage")
LEASE_MS = 30_000


def page(n: int) -> NewEntry:
    return NewEntry(b"a.example/%d" % n, 0, b'{"v":1,"u":"http://a.example/%d"}' % n)


async def one_slot_leased(q: RedisQueue):
    """a.example limited to one request at a time, two pages queued, the first leased."""
    await set_domain_limits(q.client, KEYS, Politeness(DomainLimit(concurrency=1), {}).as_hash())
    await q.enqueue([page(1), page(2)])
    (lease,) = await q.lease(5, LEASE_MS)
    return lease


@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), -float("inf"), object()])
@deferred_f_from_coro_f
async def test_a_record_json_cannot_hold_is_stored_with_null(redis_url, garbage):
    """A user's verdict mapping with NaN (json.dumps writes it, cjson decodes it and refuses
    to encode it). Before: dead.lua failed after its first writes: the entry in the DLQ
    without a record, and a.example's concurrency slot taken for good."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        lease = await one_slot_leased(q)
        info = {"class": "mine", "reason": "x", "status": garbage, "history": [{"t": garbage}]}
        assert await q.dead_letter(lease.id, lease.token, info) == 1
        record = json.loads(await q.client.hget(KEYS.dead_info, lease.id))
        assert (record["class"], record["status"], record["history"]) == (
            "mine",
            None,
            [{"t": None}],
        )
        assert [x.payload for x in await q.lease(5, LEASE_MS)] == [page(2).payload]
    finally:
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_dead_stores_a_record_it_cannot_encode_as_its_class_and_reason(
    redis_url, redis_client
):
    """The script's own rule, for a caller that sends NaN anyway (an older worker): the
    record is stored as its class and reason, the lease ends, the slot is given back."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        lease = await one_slot_leased(q)
        record = '{"class":"x","reason":"r","status":NaN}'
        args = [lease.id, lease.token, record, 10, 10**9, b"", q.order_arg]
        assert (await q._dead(keys=dead_keys(KEYS), args=args))[0] == 1
        stored = json.loads(redis_client.hget(KEYS.dead_info, lease.id))
        assert (stored["class"], stored["reason"], stored["record"]) == ("x", "r", "unreadable")
        assert redis_client.zscore(KEYS.leased, lease.id) is None
        assert [x.payload for x in await q.lease(5, LEASE_MS)] == [page(2).payload]
    finally:
        await q.client.aclose()


@pytest.mark.parametrize("garbage", ['"3x"', "[1]", "{}", "1e999", '"inf"', "2.5"])
def test_attempts_that_are_not_a_number_hide_no_entry_of_the_listing(
    redis_url, redis_client, garbage
):
    """A record's attempts (a user's verdict mapping kept them). Before: int() raised in
    DeadEntry.attempts, and `dlq list` / `dlq export` ended in a traceback: one entry hid
    every other."""
    for entry_id, attempts in (("1", "2"), ("2", garbage)):
        redis_client.zadd(KEYS.dead, {entry_id: int(entry_id)})
        record = f'{{"class":"mine","reason":"r","attempts":{attempts},"history":[{{}}]}}'
        redis_client.hset(KEYS.dead_info, entry_id, record)
        redis_client.hset(KEYS.payload, entry_id, f'{{"v":1,"u":"http://a.example/{entry_id}"}}')
    listed = cli(redis_url, "dlq", "list", KEYS.spider)
    assert listed.returncode == 0, listed.stderr
    exported = cli(redis_url, "dlq", "export", KEYS.spider)
    assert exported.returncode == 0, exported.stderr
    attempts = {e["id"]: e["attempts"] for e in map(json.loads, exported.stdout.splitlines())}
    assert attempts == {"1": 2, "2": 1 if garbage != "2.5" else 2}  # its history's 1


def test_a_verdict_mapping_keeps_status_and_attempts_only_when_whole_numbers():
    """Before: Verdict.from_meta kept "3" and 2.5, and every reader of the dead letter
    failed on them."""
    meta = {"ha_outcome": {"op": "dead", "class": "mine", "attempts": "3", "status": 2.5}}
    verdict = Verdict.from_meta(meta)
    assert verdict is not None and (verdict.attempts, verdict.status) == (None, None)
    meta = {"ha_outcome": {"op": "dead", "class": "mine", "attempts": 3, "status": 500}}
    assert Verdict.from_meta(meta)["attempts"] == 3


@pytest.mark.parametrize("key", ["dead_info", "payload", "dead_archived"])
@deferred_f_from_coro_f
async def test_purge_checks_every_key_before_its_first_write(redis_url, redis_client, key):
    """Before: a dead_info (payload, dead_archived) of another type failed purge.lua after
    its first ZREM: the entry had left the DLQ, its payload was orphaned."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        redis_client.zadd(KEYS.dead, {"1": 1000, "2": 1001})
        redis_client.hset(KEYS.payload, mapping={"1": "p1", "2": "p2"})
        redis_client.hset(KEYS.dead_info, mapping={"1": "{}", "2": "{}"})
        redis_client.delete(getattr(KEYS, key))
        redis_client.set(getattr(KEYS, key), "garbage")  # another type
        with pytest.raises(redis.ResponseError, match="WRONGTYPE purge"):
            await q.purge_dead(["1", "2"])
        assert redis_client.zrange(KEYS.dead, 0, -1) == [b"1", b"2"]  # nothing written
    finally:
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_requeue_names_the_entries_it_could_not_requeue(redis_url, redis_client):
    """An entry whose stored request is gone (deleted by hand) cannot go back to the queue.
    Before: "requeued 2 of 3 entries", exit 0, and nothing said which or why."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        await q.enqueue([page(1), page(2), page(3)])
        for lease in await q.lease(5, LEASE_MS):
            assert await q.dead_letter(lease.id, lease.token, {"class": "mine", "reason": "x"})
    finally:
        await q.client.aclose()
    lost = redis_client.zrange(KEYS.dead, 0, -1)[1].decode()
    redis_client.hdel(KEYS.payload, lost)
    done = cli(redis_url, "--prefix", KEYS.prefix, "dlq", "requeue", KEYS.spider, "--all", "--yes")
    assert done.returncode == 1, done
    assert "requeued 2 of 3 entries" in done.stdout
    assert f"{lost}: its stored request is gone" in done.stderr
    assert redis_client.zrange(KEYS.dead, 0, -1) == [lost.encode()]  # kept, for purge


@deferred_f_from_coro_f
async def test_requeue_of_a_sharded_crawl_names_the_entry_its_id_as_the_tools_show_it(
    redis_url, redis_client
):
    """Review: the shards' DeadLetterQueue each kept its own list, the sharded one none:
    "requeued 29 of 30 entries", exit 0, nothing said."""
    from tests.test_dashboard_actions import dead_letters

    await dead_letters(redis_url, "wide", 30, shards=3)  # (placed by their fingerprints)
    local = redis_client.zrange("ha:{wide:1}:dead", 0, 0)[0].decode()
    redis_client.hdel("ha:{wide:1}:payload", local)
    done = cli(redis_url, "dlq", "requeue", "wide", "--all", "--yes")
    assert done.returncode == 1, done
    assert f"dead letter 1:{local}: its stored request is gone" in done.stderr, done.stderr
    assert f"scrapy-ha dlq purge wide 1:{local}`" in done.stderr


@deferred_f_from_coro_f
async def test_a_queue_element_without_an_id_set_aside_shows_what_it_held(redis_url, redis_client):
    """A QA run: a back-queue element written by hand without an entry id was set aside as
    corrupt (sync.lua), but `dlq list` showed `?` in its URL column and `dlq show` an empty
    request: what it held (stored as its payload) was nowhere to be read, where the entries
    a worker sets aside show theirs. They show what it held."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        redis_client.rpush(KEYS.queue("0:x"), "garbage-no-id")
        redis_client.zadd(KEYS.ready, {"0:x": 0})
        assert (await q.sync(lease=1)).set_aside == 1
    finally:
        await q.client.aclose()
    (entry_id,) = (i.decode() for i in redis_client.zrange(KEYS.dead, 0, -1))
    listed = cli(redis_url, "dlq", "list", KEYS.spider)
    assert listed.returncode == 0, listed.stderr
    line = next(x for x in listed.stdout.splitlines() if x.strip().startswith(entry_id))
    assert line.endswith("garbage-no-id"), line
    shown = cli(redis_url, "dlq", "show", KEYS.spider, entry_id)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["url"] == "garbage-no-id", shown.stdout
