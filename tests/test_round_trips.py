"""What a worker's start and close wait for: the round trips to Redis, counted as the
client's writes (a pipeline is one). With Redis 3 ms away each costs the crawl 3 ms of wall
time. Real redis-server."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio
from redis.asyncio.connection import Connection
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.config.memory import MemoryConfig
from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.sharding import dupefilter_figures, set_dupefilter

KEYS = Keys("ha", "trips")


@pytest.fixture
def writes(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every write of a command (or of a pipeline) by an asyncio connection."""
    sent: list[Any] = []
    own = Connection.send_packed_command

    async def counted(self: Connection, command: Any, check_health: bool = True) -> None:
        sent.append(command)
        await own(self, command, check_health)

    monkeypatch.setattr(Connection, "send_packed_command", counted)
    return sent


async def _queue(url: str) -> RedisQueue:
    queue = RedisQueue(redis.asyncio.Redis.from_url(url), KEYS)
    await queue.client.ping()  # connected: its handshake is not counted
    return queue


@deferred_f_from_coro_f
async def test_the_dupefilters_stored_form_is_read_in_one_trip(redis_url, writes):
    queue = await _queue(redis_url)
    writes.clear()
    await set_dupefilter(queue, MemoryConfig(capacity=1000))
    # what is stored (bloom and buckets meta, time slices, the single set), then the claim
    assert len(writes) == 2
    writes.clear()
    await set_dupefilter(queue, MemoryConfig(dupefilter="bloom"), claim=False)  # no claim
    assert len(writes) == 1
    await queue.client.aclose()


@deferred_f_from_coro_f
async def test_a_leaving_worker_deletes_its_entries_in_one_trip(redis_url, writes):
    queue = await _queue(redis_url)
    await queue.client.zadd(KEYS.workers, {"w": 1})
    await queue.client.hset(KEYS.worker_stats, "w", "1 {}")
    await queue.client.hset(KEYS.sent, "nonce", 3)
    await queue.client.hset(KEYS.senders, "w", "nonce")
    writes.clear()
    await queue.leave("w", "nonce")
    assert len(writes) == 1
    for key in (KEYS.workers, KEYS.worker_stats, KEYS.sent, KEYS.senders):
        assert not await queue.client.exists(key), key
    await queue.client.aclose()


@deferred_f_from_coro_f
async def test_the_dupefilters_figures_take_two_trips(redis_url, writes):
    queue = await _queue(redis_url)
    await set_dupefilter(queue, MemoryConfig(capacity=1000))
    await queue.client.hset(KEYS.buckets, mapping={"buckets": 4096, "gen": "1", "n": 7})
    writes.clear()
    assert await dupefilter_figures(queue) == {
        "ha/dupefilter/urls": 7,
        "ha/dupefilter/over_capacity": 0,
    }
    assert len(writes) == 2  # Redis's clock, then both meta hashes
    await queue.client.aclose()
