"""What a worker's start and close wait for: the round trips to Redis, counted as the
client's writes (a pipeline is one). With Redis 3 ms away each costs the crawl 3 ms of wall
time (the ``redis_writes`` fixture). Real redis-server."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
import redis.asyncio
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.config.memory import MemoryConfig
from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.session.control import STOPPED, Control
from scrapy_ha.store.connection import check_reachable, redis_from_settings, server_version
from scrapy_ha.store.health import redis_health, warn_once
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.sharding import dupefilter_figures, set_dupefilter

KEYS = Keys("ha", "trips")


async def _queue(url: str) -> RedisQueue:
    queue = RedisQueue(redis.asyncio.Redis.from_url(url), KEYS)
    await queue.client.ping()  # connected: its handshake is not counted
    return queue


@deferred_f_from_coro_f
async def test_the_dupefilters_stored_form_is_read_in_one_trip(redis_url, redis_writes):
    queue = await _queue(redis_url)
    redis_writes.clear()
    await set_dupefilter(queue, MemoryConfig(capacity=1000))
    # what is stored (bloom and buckets meta, time slices, the single set), then the claim
    assert len(redis_writes) == 2
    redis_writes.clear()
    await set_dupefilter(queue, MemoryConfig(dupefilter="bloom"), claim=False)  # no claim
    assert len(redis_writes) == 1
    await queue.client.aclose()


@deferred_f_from_coro_f
async def test_a_leaving_worker_deletes_its_entries_in_one_trip(redis_url, redis_writes):
    queue = await _queue(redis_url)
    await queue.client.zadd(KEYS.workers, {"w": 1})
    await queue.client.hset(KEYS.worker_stats, "w", "1 {}")
    await queue.client.hset(KEYS.sent, "nonce", 3)
    await queue.client.hset(KEYS.senders, "w", "nonce")
    redis_writes.clear()
    await queue.leave("w", "nonce")
    assert len(redis_writes) == 1
    for key in (KEYS.workers, KEYS.worker_stats, KEYS.sent, KEYS.senders):
        assert not await queue.client.exists(key), key
    await queue.client.aclose()


@deferred_f_from_coro_f
async def test_the_dupefilters_figures_take_one_trip(redis_url, redis_writes):
    queue = await _queue(redis_url)
    await set_dupefilter(queue, MemoryConfig(capacity=1000))
    await queue.client.hset(KEYS.buckets, mapping={"buckets": 4096, "gen": "1", "n": 7})
    redis_writes.clear()
    assert await dupefilter_figures(queue) == {
        "ha/dupefilter/urls": 7,
        "ha/dupefilter/over_capacity": 0,
    }
    assert len(redis_writes) == 1  # Redis's clock and both meta hashes (two trips before)
    await queue.client.aclose()


@deferred_f_from_coro_f
async def test_a_stop_is_seen_in_the_same_trip_as_the_rules_even_when_a_rule_cannot_be_read(
    redis_url, redis_writes
):
    """``Control.poll`` reads the forget rules and the stop flag together; a stop asked is
    acted on before the rules are read, so a rule written wrong keeps no stop unseen."""
    closed: list[str] = []

    class Engine:
        async def close_spider_async(self, reason: str) -> None:
            closed.append(reason)

    class Crawler:
        _engine = Engine()

    rules: list[Any] = []
    admission = SimpleNamespace(set_rules=rules.append)
    queue = await _queue(redis_url)
    control = Control(Crawler(), admission, interval=10)  # type: ignore[arg-type]
    control.joined_ms = 1
    await queue.client.hset(KEYS.forget, mapping={"v": "1", "d example.com": "not a time"})
    await queue.client.set(KEYS.stop, 2)
    redis_writes.clear()
    with pytest.raises(ValueError, match="not a time"):
        await control.poll(queue)
    assert len(redis_writes) == 1
    await asyncio.sleep(0)  # the close is scheduled on the loop
    assert control.stopped and closed == [STOPPED]
    await queue.client.delete(KEYS.forget)
    await control.poll(queue)
    assert rules and rules[-1].version == 0
    await queue.client.aclose()


@deferred_f_from_coro_f
async def test_the_server_is_checked_in_two_trips(redis_url, redis_writes):
    # its INFO, read once for both the version and the checks of scrapy_ha.store.health
    # (three trips before: PING, INFO server, INFO), then CONFIG GET save
    queue = await _queue(redis_url)
    redis_writes.clear()
    info = await check_reachable(queue.client, redis_url, 5)
    assert len(redis_writes) == 1
    assert server_version(info) == (await queue.client.info("server"))["redis_version"]
    redis_writes.clear()
    problems = await warn_once(queue.client, f"{redis_url}#trips", info)
    assert len(redis_writes) == 1
    assert problems == await redis_health(queue.client)  # the same as from INFO read again
    await queue.client.aclose()


@deferred_f_from_coro_f
async def test_the_pause_is_read_in_the_controls_trip_at_connect(redis_url, redis_writes):
    # (before: an EXISTS of its own, a round trip more before the engine's first request)
    admission = SimpleNamespace(set_rules=lambda rules: None)
    queue = await _queue(redis_url)
    control = Control(SimpleNamespace(), admission, interval=10)  # type: ignore[arg-type]
    control.joined_ms = 1
    redis_writes.clear()
    assert await control.poll(queue, paused=True) is False
    assert len(redis_writes) == 1
    await queue.client.set(KEYS.paused, 1)
    redis_writes.clear()
    assert await control.poll(queue, paused=True) is True
    assert await control.poll(queue) is False  # not asked
    assert len(redis_writes) == 2
    await queue.client.aclose()


@deferred_f_from_coro_f
async def test_the_clock_a_worker_joins_at_is_read_in_the_controls_trip(redis_url, redis_writes):
    """The server's time at connect (a ``scrapy-ha stop`` asked before it is not for this
    worker) is read in the same pipeline as the stop flag, before it (before: a TIME of its
    own, a round trip more before the engine's first request)."""
    closed: list[str] = []
    crawler = SimpleNamespace(_engine=SimpleNamespace(close_spider_async=_closing(closed)))
    admission = SimpleNamespace(set_rules=lambda rules: None)
    queue = await _queue(redis_url)
    await queue.client.set(KEYS.stop, 1)  # an old stop, long before this worker joined
    control = Control(crawler, admission, interval=10)  # type: ignore[arg-type]
    redis_writes.clear()
    before = await queue.client.time()
    redis_writes.clear()
    assert await control.poll(queue, paused=True) is False
    assert len(redis_writes) == 1
    seconds, micros = before
    assert control.joined_ms >= int(seconds) * 1000 + int(micros) // 1000
    assert not control.stopped
    # it resumed a stopped crawl: the next poll says when, in its own trip
    assert not await queue.client.hexists(KEYS.run, "resumed")
    redis_writes.clear()
    await control.poll(queue)
    assert len(redis_writes) == 1
    assert int(await queue.client.hget(KEYS.run, "resumed")) == control.joined_ms
    await queue.client.set(KEYS.stop, control.joined_ms + 1)  # asked after it joined
    await control.poll(queue)
    await asyncio.sleep(0)  # the close is scheduled on the loop
    assert control.stopped and closed == [STOPPED]
    await queue.client.delete(KEYS.stop)
    await queue.client.aclose()


def _closing(closed: list[str]) -> Any:
    async def close_spider_async(reason: str) -> None:
        closed.append(reason)

    return close_spider_async


def _pings(client: Any) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_ping", {}).get("calls", 0))


@deferred_f_from_coro_f
async def test_a_new_connection_is_not_pinged_before_its_handshake(redis_url, redis_client):
    """redis-py PINGs a connection before a command when ``health_check_interval`` (30 s
    for a worker) passed since its last reply, and a new one never had a reply: every
    connection a worker opened sent a PING before its HELLO, a round trip. An idle one is
    still checked."""
    settings = Settings({"REDIS_URL": redis_url, "REDIS_PARAMS": {"health_check_interval": 1}})
    client = redis_from_settings(settings, connect_timeout=5)
    redis_client.config_resetstat()
    await check_reachable(client, redis_url, 5)  # connects: HELLO, then INFO
    assert _pings(redis_client) == 0
    pool = client.connection_pool
    (connection,) = pool._available_connections
    connection.next_health_check = asyncio.get_running_loop().time() - 1  # idle for long
    await client.get("x")
    assert _pings(redis_client) == 1
    await client.aclose()
