"""A memory check that meets a Redis busy running a long script (``BUSY``) costs that check
alone: the back-pressure goes on checking (before, it switched itself off for the rest of
the worker's life, as for a user the ACL refuses ``INFO``, and said nothing)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import redis
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.config.memory import MemoryConfig
from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.remote import Remote
from scrapy_ha.scheduler.session.pressure import Pressure
from scrapy_ha.store.sharding import make_queue


@deferred_f_from_coro_f
async def test_a_check_that_meets_a_busy_redis_does_not_switch_back_pressure_off(
    redis_url, redis_client
):
    most = redis_client.config_get("maxmemory")["maxmemory"]
    threshold = redis_client.config_get("busy-reply-threshold")["busy-reply-threshold"]
    redis_client.config_set("busy-reply-threshold", "10")
    aclient = redis.asyncio.Redis.from_url(redis_url)
    looping = redis.Redis.from_url(redis_url)

    def loop() -> None:
        with contextlib.suppress(redis.exceptions.ResponseError):  # killed
            looping.eval("while true do end", 0)

    busy = asyncio.ensure_future(asyncio.to_thread(loop))
    try:
        deadline = time.monotonic() + 10
        while True:  # until the script runs past the threshold
            try:
                await aclient.ping()
            except redis.exceptions.ResponseError as exc:
                assert "BUSY" in str(exc)
                break
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        queue = make_queue(aclient, "ha", "pressure", 1, worker="w0")
        remote = Remote()
        pressure = Pressure(MemoryConfig(), get_crawler().stats, remote, redis_url)
        await pressure.check(queue, now=0.0)  # INFO answered BUSY
        assert pressure._next == 1.0  # the next check as usual
        # (the test's client, connected before the script: a new connection's handshake is
        # answered BUSY too, and the asyncio client opened one in a run of the suite)
        redis_client.script_kill()
        await busy
        used = int(redis_client.info("memory")["used_memory"])
        redis_client.config_set("maxmemory", str(used + 1))  # far above the 90 % mark
        for now in (1.0, 2.0, 31.0):
            await pressure.check(queue, now=now)
        assert remote.held
    finally:
        with contextlib.suppress(redis.exceptions.ResponseError):
            redis_client.script_kill()
        await asyncio.wait([busy], timeout=10)
        redis_client.config_set("maxmemory", most)
        redis_client.config_set("busy-reply-threshold", threshold)
        redis_client.delete(Keys("ha", "pressure").pressure)
        looping.close()
        await aclient.aclose()
