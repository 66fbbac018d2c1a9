"""The middlewares' stores against a real redis-server: checkpoints (what the middleware and
the ``checkpoints`` commands read and delete) and the proxies' shared cool-downs."""

from __future__ import annotations

import json

import pytest
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.keys import Keys
from scrapy_ha.store.state import (
    CheckpointStore,
    ProxyCooldowns,
    StoredCheckpoint,
    UnreadableCheckpoint,
)

KEYS = Keys("ha", "books")
OTHER = Keys("ha", "books2")  # a crawl whose name starts like ours: none of its keys are ours


def put(client, keys: Keys, task: str, doc: object) -> bytes:
    raw = json.dumps(doc).encode()
    client.set(keys.checkpoint(task), raw)
    return raw


@deferred_f_from_coro_f
async def test_checkpoints_are_read_listed_and_deleted_by_task(redis_url, redis_client):
    a = put(redis_client, KEYS, "a", {"task": "a", "page": 3, "items": 40})
    put(redis_client, KEYS, "b:2", {"task": "b:2", "done": True})
    put(redis_client, OTHER, "c", {"task": "c"})
    store = CheckpointStore(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        assert await store.get("a") == {"task": "a", "page": 3, "items": 40}
        assert await store.get("missing") is None
        assert await store.tasks() == ["a", "b:2"]  # a task name may hold a colon
        entries = await store.entries()
        assert entries[0] == StoredCheckpoint("a", json.loads(a), len(a))
        assert [e.task for e in entries] == ["a", "b:2"]
        assert await store.exists()
        assert await store.delete(["a", "missing"]) == 1
        assert await store.delete([]) == 0
        assert await store.delete_all() == 1
        assert not await store.exists() and await store.tasks() == []
        assert redis_client.exists(OTHER.checkpoint("c"))  # another crawl's stays
    finally:
        await store.client.aclose()


@deferred_f_from_coro_f
async def test_cooldowns_are_marked_by_the_server_clock_and_pruned(redis_url, redis_client):
    key = KEYS.proxy_cooldowns
    now_ms = int(redis_client.time()[0] * 1000)
    garbage = {"bad:2": "garbage", "inf:5": "inf", "big:6": "1e400", "hex:7": "0x1FFFFFFFFFFF"}
    redis_client.hset(key, mapping={"old:1": now_ms - 1, "live:3": now_ms + 5, **garbage})
    store = ProxyCooldowns(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        await store.mark("new:4", now_ms, 60_000)
        assert int(redis_client.hget(key, "new:4")) == now_ms + 60_000
        assert 0 < redis_client.pttl(key) <= 60_000  # the hash goes with its newest cool-down
        assert await store.load(now_ms) == {"live:3": now_ms + 5, "new:4": now_ms + 60_000}
        # over and garbage gone (before: 'inf' and '1e400' kept, and every load failed on
        # them with an OverflowError, for good)
        assert set(redis_client.hgetall(key)) == {b"live:3", b"new:4"}
        assert await store.load(now_ms + 10) == {"new:4": now_ms + 60_000}
    finally:
        await store.client.aclose()


@deferred_f_from_coro_f
async def test_an_unreadable_checkpoint_is_listed_as_such_and_stops_no_other(
    redis_url, redis_client
):
    good = put(redis_client, KEYS, "good", {"task": "good", "page": 3})
    redis_client.set(KEYS.checkpoint("text"), b"not json")
    redis_client.set(KEYS.checkpoint("list"), b"[1, 2]")
    redis_client.hset(KEYS.checkpoint("hash"), "a", "b")
    store = CheckpointStore(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        assert await store.entries() == [
            StoredCheckpoint("good", json.loads(good), len(good)),
            StoredCheckpoint("hash", None, 0, "its key holds a hash, not a string"),
            StoredCheckpoint("list", None, 6, "it is not a JSON object"),
            StoredCheckpoint("text", None, 8, "it is not a JSON object"),
        ]
        with pytest.raises(UnreadableCheckpoint):
            await store.get("hash")
        assert await store.delete_all() == 4
        assert redis_client.keys("*") == []
    finally:
        await store.client.aclose()
