"""The sync script as a Redis function (Redis 7+), against real redis-servers: loaded once
and called with FCALL, loaded again by a server that lost it, side by side with another
version's library, on every master of a cluster, and run with EVALSHA where a server runs
no functions (Redis 6.2 has no FCALL; an ACL may deny it) or refuses a function for want
of memory."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import redis
import redis.asyncio
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.keys import Keys
from scrapy_ha.store import functions, scripts
from scrapy_ha.store.functions import LIBRARY_NAME, LibraryScript, function_name
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.sharding import make_queue
from scrapy_ha.store.url import async_client
from scrapy_ha.store.wire import NewEntry
from tests import redis_servers

if TYPE_CHECKING:
    from pathlib import Path

KEYS = Keys("ha", "fn")


def entries(names: str, host: str = "books.example") -> list[NewEntry]:
    return [NewEntry(n.encode(), 0, f"payload-{n}".encode(), host=host) for n in names]


def libraries(client: redis.Redis) -> dict[str, list[str]]:
    """Library name -> its function names, as FUNCTION LIST shows them."""
    out = {}
    for lib in client.function_list():
        fields = dict(zip(lib[::2], lib[1::2], strict=True))
        names = [dict(zip(f[::2], f[1::2], strict=True))[b"name"] for f in fields[b"functions"]]
        out[fields[b"library_name"].decode()] = [n.decode() for n in names]
    return out


def calls(client: redis.Redis, command: str) -> int:
    return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def queue(port: int) -> RedisQueue:
    return RedisQueue(redis.asyncio.Redis(port=port), KEYS)


@pytest.fixture
def server(tmp_path: Path):
    found = redis_servers.start(tmp_path / "redis")  # no persistence: a restart loses all
    yield found
    found.kill()


@deferred_f_from_coro_f
async def test_the_sync_script_is_a_function_of_this_versions_library(server):
    q = queue(server.port)
    await q.enqueue(entries("abc"))
    leases = await q.lease(3, 30000)
    assert await q.ack([(x.id, x.token) for x in leases]) == (3, 0)
    with server.client() as c:
        assert libraries(c) == {LIBRARY_NAME: [function_name("sync")]}
        assert calls(c, "fcall") == 4 and calls(c, "evalsha") == 0  # one refused: not loaded
        assert calls(c, "function|load") == 1
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_each_call_starts_from_fresh_state_counters_exact(server):
    # the library is defined once: the tallies a call keeps (lib/stats) must not carry over
    q = queue(server.port)
    for names in ("abc", "def", "ghi"):
        await q.enqueue(entries(names))
    leases = await q.lease(9, 30000)
    await q.ack([(x.id, x.token) for x in leases[:4]])
    await q.ack([(x.id, x.token) for x in leases[4:]])
    with server.client() as c:
        stats = {k.decode(): int(v) for k, v in c.hgetall(KEYS.stats).items()}
        domains = c.hgetall(KEYS.stats_domains)
    assert (stats["enqueued"], stats["acked"]) == (9, 9)
    assert int(domains[b"books.example\tenqueued"]) == 9
    assert int(domains[b"books.example\tacked"]) == 9
    assert (await q.counts()).pending == 0
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_restarted_redis_without_persistence_gets_the_library_again(tmp_path):
    first = redis_servers.start(tmp_path / "redis")
    q = queue(first.port)
    await q.enqueue(entries("ab"))
    first.kill()
    again = redis_servers.start(tmp_path / "redis", port=first.port)  # empty: no library
    try:
        with again.client() as c:
            assert libraries(c) == {}
        await q.client.connection_pool.disconnect()  # the old server's connections are gone
        assert await q.enqueue(entries("cd")) == 2  # "Function not found": loaded, called again
        with again.client() as c:
            assert libraries(c) == {LIBRARY_NAME: [function_name("sync")]}
            c.function_flush()  # as an operator may: the next call loads it again
        assert len(await q.lease(5, 30000)) == 2
        assert q._sync.functions
    finally:
        await q.client.aclose()
        again.kill()


@deferred_f_from_coro_f
async def test_two_versions_on_one_redis_keep_their_own_libraries(server, monkeypatch):
    # an older version's sync.lua (one more line): another library, other function names
    read = scripts.read_lua
    monkeypatch.setattr(
        scripts, "read_lua", lambda p: read(p) + ("\n-- older\n" if p == "sync" else "")
    )
    old_name, old_code = functions.library_code()
    monkeypatch.undo()
    assert old_name != LIBRARY_NAME
    old, new = queue(server.port), queue(server.port)
    old._sync = LibraryScript(old.client, "sync", library=(old_name, old_code))
    await old.enqueue(entries("ab"))  # the old worker loads its library with REPLACE
    leased = await new.lease(1, 30000)  # the new one loads its own: neither replaces the other
    leased += await old.lease(1, 30000)
    assert await new.ack([(x.id, x.token) for x in leased]) == (2, 0)
    with server.client() as c:
        assert libraries(c) == {
            old_name: [f"{old_name}_sync"],
            LIBRARY_NAME: [function_name("sync")],
        }
    for q in (old, new):
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_server_without_fcall_runs_the_script_with_evalsha(tmp_path):
    # Redis 6.2 has no FCALL: the same answer as a server where it is renamed away
    server = redis_servers.start(tmp_path / "redis", "--rename-command", "FCALL", "")
    q = queue(server.port)
    try:
        await q.enqueue(entries("abc"))
        leases = await q.lease(3, 30000)
        assert await q.ack([(x.id, x.token) for x in leases]) == (3, 0)
        assert not q._sync.functions
        with server.client() as c:
            assert libraries(c) == {}
            assert calls(c, "evalsha") >= 3  # the first one: NOSCRIPT
    finally:
        await q.client.aclose()
        server.kill()


@deferred_f_from_coro_f
async def test_an_acl_that_denies_functions_runs_the_script_with_evalsha(server):
    with server.client() as c:
        c.execute_command("ACL", "SETUSER", "worker", "on", ">pw", "~*", "&*", "+@all", "-fcall")
    q = RedisQueue(redis.asyncio.Redis(port=server.port, username="worker", password="pw"), KEYS)
    await q.enqueue(entries("ab"))
    assert len(await q.lease(2, 30000)) == 2
    assert not q._sync.functions
    with server.client() as c:
        assert calls(c, "evalsha") >= 2 and libraries(c) == {}
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_an_ack_over_maxmemory_still_frees_memory(tmp_path):
    # a function is refused whole over maxmemory; a script only at its first write that may
    # grow memory: an ack alone still runs, as it did before functions
    server = redis_servers.start(tmp_path / "redis")
    q = queue(server.port)
    try:
        await q.enqueue(entries("abcd"))
        leases = await q.lease(4, 30000)
        with server.client() as c:
            for i in range(20):
                c.set(f"filler:{i}", b"x" * 100_000)
            used = int(c.info("memory")["used_memory"])
            c.config_set("maxmemory", used - 1_000_000)  # a megabyte over
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                c.fcall(function_name("sync"), 0)  # refused before it starts
        assert await q.ack([(x.id, x.token) for x in leases[:2]]) == (2, 0)
        with server.client() as c:
            c.function_flush()  # and no library (a restart): it cannot be loaded over maxmemory
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                c.function_load(functions.LIBRARY_CODE)
        assert await q.ack([(x.id, x.token) for x in leases[2:]]) == (2, 0)
        assert (await q.counts()).leased == 0
    finally:
        await q.client.aclose()
        server.kill()


class Squeezed(redis.asyncio.Redis):
    """A worker whose load of the library takes Redis over maxmemory (the library's size,
    or other clients' writes meanwhile)."""

    async def function_load(self, code, replace=False):  # type: ignore[override]
        loaded = await super().function_load(code, replace)
        used = int((await self.info("memory"))["used_memory"])
        await self.config_set("maxmemory", used - 1_000_000)
        return loaded


@deferred_f_from_coro_f
async def test_a_call_refused_over_maxmemory_right_after_the_load_runs_with_evalsha(server):
    # the library loads, and Redis is over maxmemory: the FCALL that follows is refused,
    # and the call runs as a script (an ack alone frees memory)
    q = RedisQueue(Squeezed(port=server.port), KEYS)
    with server.client() as c:
        c.function_load(functions.LIBRARY_CODE)
        await q.enqueue(entries("abcd"))
        leases = await q.lease(4, 30000)
        for i in range(20):
            c.set(f"filler:{i}", b"x" * 100_000)
        c.function_flush()  # a restart without persistence, a failover
        assert await q.ack([(x.id, x.token) for x in leases[:2]]) == (2, 0)
        assert libraries(c) == {LIBRARY_NAME: [function_name("sync")]}  # it was loaded
        assert calls(c, "evalsha") >= 1  # the FCALL after the load refused: a script ran
        c.config_set("maxmemory", 0)
    assert await q.ack([(x.id, x.token) for x in leases[2:]]) == (2, 0)
    assert q._sync.functions
    await q.client.aclose()


class Racing(redis.asyncio.Redis):
    """A worker whose call finds the library missing while another worker loads it."""

    other: RedisQueue

    async def fcall(self, function, numkeys, *keys_and_args):  # type: ignore[override]
        try:
            return await super().fcall(function, numkeys, *keys_and_args)
        except redis.exceptions.ResponseError:
            await self.other.enqueue(entries("z"))  # it loads the library first
            raise


@deferred_f_from_coro_f
async def test_workers_that_find_the_library_missing_at_once_load_it_once(server):
    first = queue(server.port)
    late = RedisQueue(Racing(port=server.port), KEYS)
    late.client.other = first  # type: ignore[attr-defined]
    assert await late.enqueue(entries("ab")) == 2
    with server.client() as c:
        load = c.info("commandstats")["cmdstat_function|load"]
        # two loads sent, one run (and replicated): the second is told the library exists
        assert (int(load["calls"]), int(load["failed_calls"])) == (2, 1)
        assert libraries(c) == {LIBRARY_NAME: [function_name("sync")]}
    assert late._sync.functions and (await first.counts()).pending == 3
    for q in (first, late):
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_cluster_routes_each_call_by_its_keys_and_loads_where_it_runs(tmp_path):
    cluster = redis_servers.start_cluster(tmp_path, masters=3, replicas=0)
    client = async_client(Settings({"REDIS_URL": cluster.url}), connect_timeout=5)
    q = make_queue(client, "ha", "fn", 3, worker="w1")  # 3 shards, one slot each
    try:
        await q.sync(enqueue=entries("abcdefghijkl"))
        owners = {cluster.owner_of(shard.keys.queues).port for shard in q.shards}
        for port in cluster.masters():  # the library where a shard is, and nowhere else
            with redis.Redis(port=port) as c:
                assert libraries(c) == (
                    {LIBRARY_NAME: [function_name("sync")]} if port in owners else {}
                ), port
        owner = sorted(owners)[0]
        with redis.Redis(port=owner) as c:
            c.function_flush()  # one master lost it (a new, empty master): loaded again
        leased = []
        for _ in range(10):  # a round leases from the shards in turn
            leased += await q.lease(12 - len(leased), 30000)
        assert len(leased) == 12
        for port in cluster.masters():
            with redis.Redis(port=port) as c:
                assert LIBRARY_NAME in libraries(c) or port not in owners
                # the keys of FCALL read from its arguments, as EVALSHA's: no server asked
                assert calls(c, "command|getkeys") == 0, port
    finally:
        await client.aclose()
        cluster.stop()


@deferred_f_from_coro_f
async def test_a_cluster_without_functions_runs_the_script_with_evalsha(tmp_path):
    # a Redis 6.2 cluster: no FCALL, no FUNCTION
    renamed = ("--rename-command", "FCALL", "", "--rename-command", "FUNCTION", "")
    cluster = redis_servers.start_cluster(tmp_path, masters=3, replicas=0, args=renamed)
    client = async_client(Settings({"REDIS_URL": cluster.url}), connect_timeout=5)
    q = make_queue(client, "ha", "fn", 3, worker="w1")
    try:
        for name in "abcdef":
            await q.sync(enqueue=entries(name))
        assert not any(shard._sync.functions for shard in q.shards)
        leased = []
        for _ in range(10):
            leased += await q.lease(6 - len(leased), 30000)
        assert len(leased) == 6
    finally:
        await client.aclose()
        cluster.stop()
