"""A consumer woken from its blocking read by something other than its stream's deletion
(a primary demoted by a failover: ``UNBLOCKED force unblock from blocking operation,
instance state changed``; ``CLIENT UNBLOCK ... ERROR``) goes on: its stream is there."""

from __future__ import annotations

import asyncio

import redis
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.items import JsonLinesSink, consume
from tests.test_items_sinks import KEYS, fill, lines


async def _blocked_consumer(client: redis.asyncio.Redis) -> int:
    for _ in range(400):
        for c in await client.client_list():
            if c["cmd"] == "xreadgroup" and "b" in c["flags"]:
                return int(c["id"])
        await asyncio.sleep(0.025)
    raise AssertionError("the consumer never blocked")


async def _run(redis_url, tmp_path, wake) -> None:
    await fill(redis_url, range(1, 3))
    path = tmp_path / "i.jl"
    stop = asyncio.Event()
    task = asyncio.ensure_future(
        consume(redis_url, "s", JsonLinesSink(path), group="jl", stop=stop, block=5)
    )
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await wake(client, await _blocked_consumer(client))
        await fill(redis_url, range(3, 5))  # more items after it was woken
        for _ in range(200):
            if task.done() or (path.exists() and lines(path) == [1, 2, 3, 4]):
                break
            await asyncio.sleep(0.05)
        assert not task.done(), task.exception()  # it went on
        assert lines(path) == [1, 2, 3, 4]
        assert await client.exists(KEYS.items)
    finally:
        stop.set()
        await client.execute_command("REPLICAOF", "NO", "ONE")
        await asyncio.wait([task], timeout=10)
        await client.aclose()


@deferred_f_from_coro_f
async def test_a_consumer_woken_by_a_failover_goes_on(redis_url, tmp_path):
    async def failover(client, _id):  # demoted, then promoted again: the data stays
        await client.execute_command("REPLICAOF", "127.0.0.1", "1")
        await asyncio.sleep(0.2)
        await client.execute_command("REPLICAOF", "NO", "ONE")

    await _run(redis_url, tmp_path, failover)


@deferred_f_from_coro_f
async def test_a_consumer_woken_by_client_unblock_goes_on(redis_url, tmp_path):
    async def unblock(client, client_id):
        assert await client.client_unblock(client_id, error=True)

    await _run(redis_url, tmp_path, unblock)
