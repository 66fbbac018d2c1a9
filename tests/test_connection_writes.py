"""The worker's asyncio connections write a command without a task of its own (redis-py's
``asyncio.wait_for`` makes one per command on Python 3.11), and keep what that path gave:
a write Redis does not take within ``socket_timeout`` fails and drops the connection, and a
health check that is due still runs first. Real redis-server. The behaviour is checked on
every Python; the task counted only where the connections are changed (3.11.3 to 3.11.x:
``TIMED_WRITES``)."""

from __future__ import annotations

import asyncio
import signal
from typing import TYPE_CHECKING, Any

import pytest
import redis
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.store.connection import TIMED_WRITES, redis_from_settings
from tests import redis_servers

if TYPE_CHECKING:
    from pathlib import Path


def _client(url: str, **params: Any) -> Any:
    return redis_from_settings(
        Settings({"REDIS_URL": url, "REDIS_PARAMS": params}), connect_timeout=2
    )


@pytest.mark.skipif(not TIMED_WRITES, reason="redis-py's own writes make no task here")
@deferred_f_from_coro_f
async def test_a_command_is_written_without_a_task_of_its_own(redis_url):
    loop = asyncio.get_running_loop()
    before = loop.get_task_factory()
    writes: list[str] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task:
        name = getattr(coro, "__qualname__", "")
        if "send_packed_command" in name:
            writes.append(name)
        if before is not None:
            return before(loop, coro, **kwargs)
        return asyncio.Task(coro, loop=loop, **kwargs)

    client = _client(redis_url)
    try:
        await client.ping()  # connected first: a connect goes to redis-py's own path
        loop.set_task_factory(factory)
        for n in range(20):
            assert await client.echo(f"m{n}") == f"m{n}".encode()
        pipe = client.pipeline(transaction=False)
        pipe.set("k", "v").get("k")
        assert await pipe.execute() == [True, b"v"]
    finally:
        loop.set_task_factory(before)
        await client.aclose()
    assert writes == []


@deferred_f_from_coro_f
async def test_a_write_redis_does_not_take_times_out_and_drops_the_connection(tmp_path: Path):
    server = redis_servers.start(tmp_path / "redis")
    client = _client(f"redis://127.0.0.1:{server.port}/0", socket_timeout=0.5)
    try:
        conn = client.connection_pool.make_connection()
        await conn.connect()
        await conn.send_command("PING")
        assert await conn.read_response() in (b"PONG", "PONG", True)
        server.proc.send_signal(signal.SIGSTOP)  # it reads nothing: the socket's buffers fill
        try:
            with pytest.raises(redis.exceptions.TimeoutError, match="Timeout writing to socket"):
                await conn.send_command("SET", "k", b"x" * (16 << 20))
            assert not conn.is_connected
        finally:
            server.proc.send_signal(signal.SIGCONT)
        assert await client.ping()
    finally:
        await client.aclose()
        server.kill()


@deferred_f_from_coro_f
async def test_a_health_check_that_is_due_still_runs_before_the_write(redis_url):
    client = _client(redis_url)
    stats = redis.Redis.from_url(redis_url)
    try:

        def pings() -> int:
            return int(stats.info("commandstats").get("cmdstat_ping", {}).get("calls", 0))

        conn = client.connection_pool.make_connection()
        await conn.connect()
        await conn.send_command("ECHO", "a")
        await conn.read_response()
        before = pings()
        await conn.send_command("ECHO", "b")  # checked at the last read: none due
        assert await conn.read_response() == b"b"
        assert pings() == before
        conn.next_health_check = 0  # due
        await conn.send_command("ECHO", "c")
        assert await conn.read_response() == b"c"
        assert pings() == before + 1
        await conn.disconnect()
    finally:
        stats.close()
        await client.aclose()
