"""How often a worker reads Redis's memory for back-pressure (scheduler/session/pressure.py):
every second while a mark applies, every 30 s while none can (the marks are fractions and
the server has no maxmemory), so that a maxmemory set during the crawl is still seen."""

from __future__ import annotations

import pytest
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.config.memory import (
    MEMORY_CHECK_INTERVAL,
    MEMORY_UNBOUNDED_INTERVAL,
    MemoryConfig,
)
from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.remote import Remote
from scrapy_ha.scheduler.session.pressure import Pressure
from scrapy_ha.store.sharding import make_queue


def _reads(client) -> int:
    stats = client.info("commandstats").get("cmdstat_info", {})
    return int(stats.get("calls", 0))


async def _checks(redis_url: str, times: list[float]) -> None:
    """A worker's checks at *times* (seconds), with the default marks."""
    aclient = redis.asyncio.Redis.from_url(redis_url)
    try:
        queue = make_queue(aclient, "ha", "pressure", 1, worker="w0")
        pressure = Pressure(MemoryConfig(), get_crawler().stats, Remote(), redis_url)
        for now in times:
            await pressure.check(queue, now=now)
    finally:
        await aclient.aclose()


@deferred_f_from_coro_f
async def test_without_maxmemory_the_memory_is_read_every_30_s(redis_url, redis_client):
    # before: every second, for marks that cannot apply
    assert redis_client.config_get("maxmemory")["maxmemory"] == "0"
    redis_client.config_resetstat()
    times = [i * MEMORY_CHECK_INTERVAL for i in range(int(MEMORY_UNBOUNDED_INTERVAL) + 1)]
    await _checks(redis_url, times)
    assert _reads(redis_client) == 2  # at 0 and at 30


@deferred_f_from_coro_f
async def test_with_maxmemory_the_memory_is_read_every_second(redis_url, redis_client):
    most = redis_client.config_get("maxmemory")["maxmemory"]
    redis_client.config_set("maxmemory", str(1 << 30))
    try:
        redis_client.config_resetstat()
        await _checks(redis_url, [0.0, 1.0, 2.0, 3.0])
        assert _reads(redis_client) == 4
    finally:
        redis_client.config_set("maxmemory", most)


@deferred_f_from_coro_f
async def test_a_maxmemory_set_during_the_crawl_holds_it_back_at_the_next_read(
    redis_url, redis_client
):
    most = redis_client.config_get("maxmemory")["maxmemory"]
    aclient = redis.asyncio.Redis.from_url(redis_url)
    try:
        queue = make_queue(aclient, "ha", "pressure", 1, worker="w0")
        remote = Remote()
        pressure = Pressure(MemoryConfig(), get_crawler().stats, remote, redis_url)
        await pressure.check(queue, now=0.0)
        used = int(redis_client.info("memory")["used_memory"])
        redis_client.config_set("maxmemory", str(used + 1))  # far above the 90 % mark
        await pressure.check(queue, now=1.0)
        assert not remote.held  # not read again yet
        await pressure.check(queue, now=MEMORY_UNBOUNDED_INTERVAL)
        assert remote.held
    finally:
        redis_client.config_set("maxmemory", most)
        await aclient.aclose()


@pytest.mark.parametrize("loading", [0, 1])
@deferred_f_from_coro_f
async def test_at_connect_the_memory_is_the_info_read_there(redis_url, redis_client, loading):
    # the worker's start reads INFO once (store/connection.check_reachable): back-pressure
    # judges from it, with no read of its own (a round trip less at start); but INFO
    # answers while Redis loads its data (PING does not), and its used_memory then is not
    # the crawl's: read again
    aclient = redis.asyncio.Redis.from_url(redis_url)
    try:
        queue = make_queue(aclient, "ha", "pressure", 1, worker="w0")
        remote = Remote()
        pressure = Pressure(MemoryConfig(), get_crawler().stats, remote, redis_url)
        info = await aclient.info()
        info["maxmemory"] = int(info["used_memory"]) + 1  # far above the 90 % mark
        info["loading"] = loading
        redis_client.config_resetstat()
        await pressure.check(queue, now=0.0, info=info)
        assert _reads(redis_client) == loading
        assert remote.held == (not loading)  # read again: the server has no maxmemory
    finally:
        await aclient.aclose()


@deferred_f_from_coro_f
async def test_a_worker_started_between_the_marks_holds_back_with_the_others(
    redis_url, redis_client
):
    # before: it leased while the others held back, and the status said the crawl leased
    # nothing new (their mark)
    aclient = redis.asyncio.Redis.from_url(redis_url)
    try:
        redis_client.set("ha-test-ballast", b"x" * (8 << 20))
        with_ballast = int(redis_client.info("memory")["used_memory"])
        redis_client.delete("ha-test-ballast")
        without = int(redis_client.info("memory")["used_memory"])
        # bytes: the ballast puts memory above the high mark, its deletion between the marks
        config = MemoryConfig(high=(with_ballast + without) // 2, low=2)
        queue = make_queue(aclient, "ha", "pressure", 1, worker="w0")
        held, late = Remote(), Remote()
        first = Pressure(config, get_crawler().stats, held, redis_url)
        redis_client.set("ha-test-ballast", b"x" * (8 << 20))
        await first.check(queue, now=0.0)
        assert held.held
        redis_client.delete("ha-test-ballast")
        used = int(redis_client.info("memory")["used_memory"])
        assert config.low <= used < config.high
        second = Pressure(config, get_crawler().stats, late, redis_url)
        await second.check(queue, now=0.0)
        assert late.held
        await first.check(queue, now=MEMORY_CHECK_INTERVAL)
        assert held.held  # above the low mark: both hold until memory falls below it
        mark = Keys("ha", "pressure").pressure
        redis_client.delete(mark)  # the first worker gone: its mark expired
        alone = Remote()
        await Pressure(config, get_crawler().stats, alone, redis_url).check(queue, now=0.0)
        assert not alone.held  # no worker holds back: between the marks is no reason
        # the one that joined it leases again, and keeps no mark alive: workers replaced
        # one by one between the marks kept each other held for ever (a review)
        await second.check(queue, now=MEMORY_CHECK_INTERVAL)
        assert not late.held and not redis_client.exists(mark)
    finally:
        redis_client.delete("ha-test-ballast")
        await aclient.aclose()


@deferred_f_from_coro_f
async def test_the_marks_since_is_the_first_workers_while_the_mark_lives(redis_url, redis_client):
    # before: each worker above the high mark wrote its own hold's start every second, so
    # `scrapy-ha status`'s "since" moved between the workers' times
    import json
    import time

    aclient = redis.asyncio.Redis.from_url(redis_url)
    mark = Keys("ha", "pressure").pressure
    try:
        redis_client.set("ha-test-ballast", b"x" * (8 << 20))
        config = MemoryConfig(high=1 << 20, low=1 << 20)  # memory is above it
        queue = make_queue(aclient, "ha", "pressure", 1, worker="w0")
        first = Pressure(config, get_crawler().stats, Remote(), redis_url)
        await first.check(queue, now=0.0)
        since = json.loads(redis_client.get(mark))["since"]
        while int(time.time() * 1000) <= since:  # the second worker's hold starts later
            time.sleep(0.001)
        second = Pressure(config, get_crawler().stats, Remote(), redis_url)
        await second.check(queue, now=0.0)
        assert second.remote.held
        for now in (1.0, 2.0):
            await second.check(queue, now=now)
            assert json.loads(redis_client.get(mark))["since"] == since
            await first.check(queue, now=now)
            assert json.loads(redis_client.get(mark))["since"] == since
        redis_client.delete(mark)  # gone (expired, or memory fell below the low mark)
        await second.check(queue, now=3.0)
        assert json.loads(redis_client.get(mark))["since"] > since  # a new mark, its own
        redis_client.set(mark, b"garbage")  # written by hand: written over
        await first.check(queue, now=4.0)
        assert json.loads(redis_client.get(mark))["since"] == since
    finally:
        redis_client.delete("ha-test-ballast", mark)
        await aclient.aclose()


@deferred_f_from_coro_f
async def test_the_marks_since_is_redis_time_not_the_workers(redis_url, redis_client, monkeypatch):
    # before: the worker's own clock (an hour ahead here: `status` said the hold began an
    # hour from now); every stored time is Redis's
    import json
    import time
    import types

    from scrapy_ha.scheduler.session import pressure as module

    ahead = types.SimpleNamespace(time=lambda: time.time() + 3600, monotonic=time.monotonic)
    monkeypatch.setattr(module, "time", ahead)
    aclient = redis.asyncio.Redis.from_url(redis_url)
    mark = Keys("ha", "pressure").pressure
    try:
        redis_client.set("ha-test-ballast", b"x" * (8 << 20))
        queue = make_queue(aclient, "ha", "pressure", 1, worker="w0")
        config = MemoryConfig(high=1 << 20, low=1 << 20)  # memory is above it
        worker = Pressure(config, get_crawler().stats, Remote(), redis_url)
        await worker.check(queue, now=0.0)
        seconds, micros = redis_client.time()
        redis_ms = int(seconds) * 1000 + int(micros) // 1000
        since = json.loads(redis_client.get(mark))["since"]
        assert redis_ms - 60_000 < since <= redis_ms, (since, redis_ms)
    finally:
        redis_client.delete("ha-test-ballast", mark)
        await aclient.aclose()
