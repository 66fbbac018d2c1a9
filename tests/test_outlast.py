"""A worker closing on a finished crawl while other heartbeats live (scheduler/session/
outlast.py): it ends the crawl once a killed worker's heartbeat expired, and leaves it to a
worker that proves alive, that left, or that started since; a Redis that fails the wait
is one WARNING."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import TYPE_CHECKING

import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.config.scheduler import SchedulerConfig
from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.session.outlast import outlast
from scrapy_ha.store.queue import RedisQueue
from tests import redis_servers

if TYPE_CHECKING:
    from collections.abc import Callable

KEYS = Keys("ha", "s")
CONFIG = replace(SchedulerConfig(), worker_id="closing", heartbeat_ttl=30.0, close_timeout=2.0)


async def finished_crawl(url: str, other_for_ms: int) -> RedisQueue:
    """A finished crawl (a dupefilter, nothing pending) with another worker's heartbeat
    live for *other_for_ms*, as a worker killed lately leaves it."""
    queue = RedisQueue(redis.asyncio.Redis.from_url(url), KEYS)
    await queue.client.delete(KEYS.finish_record)  # a worker joining a run deletes it
    await queue.client.sadd(KEYS.dupefilter, b"fingerprint")
    await heartbeat(queue, "other", other_for_ms)
    return queue


async def heartbeat(queue: RedisQueue, worker: str, for_ms: int) -> None:
    seconds, micros = await queue.client.time()
    await queue.client.zadd(KEYS.workers, {worker: seconds * 1000 + micros // 1000 + for_ms})


@deferred_f_from_coro_f
async def test_a_killed_workers_heartbeat_is_outlasted_then_the_crawl_ended(redis_url, caplog):
    queue = await finished_crawl(redis_url, 1500)
    with caplog.at_level(logging.INFO):
        assert await outlast(queue, CONFIG, lambda: False)
    assert not await queue.client.exists(KEYS.dupefilter, KEYS.workers)
    assert "1 other worker(s) have a live heartbeat" in caplog.text
    assert "another worker ends it" not in caplog.text
    await queue.client.aclose()


def watching() -> tuple[asyncio.Event, Callable[[], bool]]:
    """An event set once the wait has had its first look (its ``stop_asked`` is called
    after each look), and that ``stop_asked``."""
    looked = asyncio.Event()

    def stop_asked() -> bool:
        looked.set()
        return False

    return looked, stop_asked


@deferred_f_from_coro_f
async def test_a_heartbeat_renewed_or_new_leaves_the_crawl_to_its_worker(redis_url, caplog):
    for change in ("renewed", "new"):
        queue = await finished_crawl(redis_url, 20_000)
        looked, stop_asked = watching()
        waiting = asyncio.ensure_future(outlast(queue, CONFIG, stop_asked))
        await looked.wait()
        if change == "renewed":  # that worker lives: it closes on the crawl in its turn
            await heartbeat(queue, "other", 25_000)
        else:  # a worker started a new run
            await heartbeat(queue, "started", 30_000)
        with caplog.at_level(logging.INFO):
            assert not await waiting, change
        assert await queue.client.exists(KEYS.dupefilter), change
        assert "another worker ends it" in caplog.text, change
        caplog.clear()
        await queue.client.delete(KEYS.workers)
        await queue.client.aclose()


@deferred_f_from_coro_f
async def test_a_worker_that_left_ends_the_crawl_itself_or_this_one_does(redis_url, caplog):
    """Removed before its expiry, a heartbeat's worker left: by a finish of its own (then it
    ended the crawl, once), or closing for another reason (then nobody else will)."""
    for finishing in (True, False):
        queue = await finished_crawl(redis_url, 20_000)
        looked, stop_asked = watching()
        waiting = asyncio.ensure_future(outlast(queue, CONFIG, stop_asked))
        await looked.wait()
        if finishing:
            other = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
            assert await other.finish("other")
            await other.client.aclose()
        else:  # a shutdown, a closespider limit: it leaves without a finish
            await queue.client.zrem(KEYS.workers, "other")
        with caplog.at_level(logging.INFO):
            assert bool(await waiting) is not finishing
        assert not await queue.client.exists(KEYS.dupefilter)
        assert ("another worker ends it" in caplog.text) is finishing
        caplog.clear()
        await queue.client.aclose()


@deferred_f_from_coro_f
async def test_a_shutdown_asked_during_the_wait_stops_it_saying_so(redis_url, caplog):
    queue = await finished_crawl(redis_url, 20_000)
    looks: list[int] = []

    def stop_asked() -> bool:  # asked once the wait has looked once
        looks.append(1)
        return len(looks) > 1

    with caplog.at_level(logging.INFO):
        assert not await outlast(queue, CONFIG, stop_asked)
    assert "(a shutdown was asked): the crawl of s stays in Redis" in caplog.text
    assert await queue.client.exists(KEYS.dupefilter)
    await queue.client.aclose()


@deferred_f_from_coro_f
async def test_a_redis_lost_during_the_wait_is_one_warning(tmp_path, caplog):
    server = redis_servers.start(tmp_path / "redis")
    try:
        queue = await finished_crawl(f"redis://127.0.0.1:{server.port}", 20_000)
        looked, stop_asked = watching()
        waiting = asyncio.ensure_future(outlast(queue, CONFIG, stop_asked))
        await looked.wait()
        server.kill()
        with caplog.at_level(logging.INFO):
            assert not await waiting
        assert "Could not end the finished crawl of s (" in caplog.text
        assert "`scrapy-ha flush s`" in caplog.text
        await queue.client.aclose()
    finally:
        server.kill()


@deferred_f_from_coro_f
async def test_a_heartbeat_of_inf_written_by_hand_is_read_not_a_crash(redis_url):
    """``ZADD workers inf w``: the wait's read raised OverflowError in the worker's close."""
    from scrapy_ha.scheduler.session.outlast import _look

    queue = await finished_crawl(redis_url, 60_000)
    await queue.client.zadd(KEYS.workers, {"by-hand": float("inf")})
    _, others, _ = await _look(queue, "me")
    assert others["by-hand"] == 2**53 and "other" in others
    await queue.client.aclose()
