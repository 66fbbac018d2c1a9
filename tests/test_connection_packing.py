"""The worker's asyncio connections pack commands with hiredis (a dependency), as redis-py's
blocking client does: the same bytes as redis-py's own packing for every argument type a
command takes, the same error for one it refuses, and redis-py's packing kept for another
``REDIS_ENCODING``. Real redis-server: a round of every type comes back as sent."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio
from redis.asyncio.connection import Connection
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.store.connection import redis_from_settings

ARGS = [
    ("SET", "k", "é☃ text"),
    ("FUNCTION LOAD", "#!lua name=x\nredis.register_function('f', function() end)"),
    (b"CONFIG GET", b"maxmemory"),
    ("FCALL", "f", 3, "a", "b", "c", 0, -5, 2**70, 1.5, 0.1, 1e20, float("inf")),
    ("SET", b"\x00\xff", bytearray(b"ab"), memoryview(b"cd"), "x" * 100_000),
]


def packed(conn: Connection, args: tuple) -> bytes:
    return b"".join(bytes(chunk) for chunk in conn.pack_command(*args))


def test_hiredis_packs_the_worker_commands_as_redis_py_does():
    client = redis_from_settings(
        Settings({"REDIS_URL": "redis://127.0.0.1:1/0"}), connect_timeout=1
    )
    cls = client.connection_pool.connection_class
    ours, theirs = cls(), Connection()
    assert "HiredisPacking" in cls.__name__ and len(ours.pack_command("PING")) == 1
    for args in ARGS:
        assert packed(ours, args) == packed(theirs, args), args[0]
    for bad in (True, None, object()):
        with pytest.raises(redis.exceptions.DataError):
            ours.pack_command("SET", "k", bad)


def test_another_encoding_keeps_redis_py_packing():
    settings = Settings({"REDIS_URL": "redis://127.0.0.1:1/0", "REDIS_ENCODING": "latin-1"})
    client = redis_from_settings(settings, connect_timeout=1)
    ours = client.connection_pool.connection_class(encoding="latin-1")
    assert packed(ours, ("SET", "k", "é")) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n\xe9\r\n"


@deferred_f_from_coro_f
async def test_every_type_comes_back_from_redis_as_sent(redis_url):
    client = redis_from_settings(Settings({"REDIS_URL": redis_url}), connect_timeout=2)
    try:
        values = ["é☃", b"\x00\xff", bytearray(b"ab"), memoryview(b"cd"), 7, -5, 1.5, "y" * 70_000]
        await client.rpush("l", *values)
        assert await client.lrange("l", 0, -1) == [
            "é☃".encode(),
            b"\x00\xff",
            b"ab",
            b"cd",
            b"7",
            b"-5",
            b"1.5",
            b"y" * 70_000,
        ]
    finally:
        await client.aclose()


def test_encoding_errors_other_than_strict_keep_redis_py_packing():
    settings = Settings({"REDIS_URL": "redis://127.0.0.1:1/0"})
    client = redis_from_settings(settings, connect_timeout=1)
    ours = client.connection_pool.connection_class(encoding_errors="surrogateescape")
    assert packed(ours, ("SET", "k", "\udcff")) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n\xff\r\n"
    utf8 = client.connection_pool.connection_class(encoding="UTF8")  # another spelling
    assert packed(utf8, ("SET", "k", "é")) == packed(Connection(), ("SET", "k", "é"))
