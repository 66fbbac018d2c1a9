"""A slot of the crawl moved to a node just added to a real Redis Cluster (``CLUSTER
MEET``, then ``CLUSTER SETSLOT ... MIGRATING/IMPORTING`` and ``MIGRATE``, as ``redis-cli
--cluster reshard`` and ``rebalance --cluster-use-empty-masters`` do), where a crawl found:
redis-py (8.1, redis/redis-py#4015) follows an ``ASK`` redirect only to a node it learnt
from ``CLUSTER SLOTS``, and a node that serves no slot yet is not there. Every command
redirected to it failed with ``AttributeError: 'NoneType' object has no attribute
'execute_command'``, and each worker logged a traceback every second of the migration
(115 in a migration of two minutes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import redis
from redis.crc import key_slot
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.demo import harness
from scrapy_ha.store.asking import outage
from scrapy_ha.store.connection import redis_from_settings, sync_redis_from_settings
from tests import redis_servers
from tests.cli_seed import scrapy_ha

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

#: a key of the crawl that exists (migrated first) and one that never does (a crawl's
#: ``forget`` hash, read by every worker's round: on a migrating slot, an ASK)
MOVED_KEY, NEVER_KEY = "ha:{catalogue}:stats", "ha:{catalogue}:forget"


@pytest.fixture
def migrating(tmp_path: Path) -> Iterator[redis_servers.Cluster]:
    """Three masters and a fourth node with no slot, the crawl's slot half moved to it."""
    cluster = redis_servers.start_cluster(tmp_path / "cluster", replicas=0)
    try:
        new = _joined(cluster, tmp_path / "new")
        slot = key_slot(MOVED_KEY.encode())
        source = cluster.owner_of(MOVED_KEY)
        assert source is not None
        with source.client() as src, new.client() as dst:
            src.hset(MOVED_KEY, "acked", 7)
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", _id(src))
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", _id(dst))
            src.execute_command("MIGRATE", "127.0.0.1", new.port, "", 0, 5000, "KEYS", MOVED_KEY)
        yield cluster
    finally:
        cluster.stop()


def _id(client: redis.Redis) -> str:
    return client.execute_command("CLUSTER", "MYID").decode()  # type: ignore[no-any-return]


def _joined(cluster: redis_servers.Cluster, directory: Path) -> redis_servers.Server:
    """A new master with no slot, known to every node (``redis-cli --cluster add-node``),
    and the cluster ok in every node's view (a node that does not see it so yet refuses a
    ``MIGRATE`` to it: CLUSTERDOWN)."""
    port = redis_servers._cluster_port()
    conf = str(directory / "nodes.conf")
    new = redis_servers.start(
        directory, "--cluster-enabled", "yes", "--cluster-config-file", conf, port=port
    )
    cluster.nodes.append(new)
    with cluster.nodes[0].client() as c:
        c.execute_command("CLUSTER", "MEET", "127.0.0.1", new.port)

    def known() -> bool:
        for node in cluster.nodes:
            with node.client() as c:
                lines = c.execute_command("CLUSTER", "NODES").decode().splitlines()
            if len(lines) != len(cluster.nodes) or any("handshake" in x for x in lines):
                return False
        return redis_servers._cluster_ok(cluster)  # (the new node's view of it too)

    harness.wait_for(known, "every node to know the new one", redis_servers.START_TIMEOUT, 0.2)
    return new


def test_the_blocking_client_follows_an_ask_to_a_node_with_no_slot(migrating):
    client = sync_redis_from_settings(Settings({"REDIS_URL": migrating.url}), connect_timeout=5)
    again = sync_redis_from_settings(Settings({"REDIS_URL": migrating.url}), connect_timeout=5)
    try:
        assert client.hgetall(MOVED_KEY) == {b"acked": b"7"}
        assert client.hgetall(NEVER_KEY) == {}
        # (the asking class is made once, not once a client)
        assert type(client.nodes_manager) is type(again.nodes_manager)
    finally:
        client.close()
        again.close()


@deferred_f_from_coro_f
async def test_the_asyncio_client_follows_an_ask_to_a_node_with_no_slot(migrating):
    client = redis_from_settings(Settings({"REDIS_URL": migrating.url}), connect_timeout=5)
    try:
        assert await client.hgetall(MOVED_KEY) == {b"acked": b"7"}
        assert await client.hgetall(NEVER_KEY) == {}
        pipe = client.pipeline()  # (a worker's round reads its controls so)
        pipe.hgetall(NEVER_KEY)
        pipe.hget(MOVED_KEY, "acked")
        assert await pipe.execute() == [{}, b"7"]
    finally:
        await client.aclose()


@pytest.mark.parametrize("command", [["workers"], ["dlq", "list"]])
def test_the_cli_reads_a_crawl_whose_slot_migrates(migrating, command):
    """A command of several keys is refused on a slot that migrates (TRYAGAIN) until the
    slot has moved, for as long as the migration lasts; the commands that read one key at
    a time work meanwhile."""
    done = scrapy_ha("--redis-url", migrating.url, *command, "catalogue")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr


def test_status_on_a_crawl_whose_slot_migrates_says_so(migrating):
    """``status`` reads the crawl's counts at one instant, in a script of several keys: it
    waits for the end of the migration, and says so, where it said Redis "went away"."""
    done = scrapy_ha("--redis-url", migrating.url, "status", "catalogue")
    assert done.returncode == 2
    assert "went away" not in done.stderr
    assert "a slot of the crawl is migrating" in done.stderr, done.stderr
    assert "counts:" not in done.stderr  # (no line of the script's source)


def test_a_worker_says_a_slot_migrates_not_that_redis_is_unreachable(migrating):
    """A worker's round of several keys on the migrating slot is refused (TRYAGAIN) until
    redis-py gives up; its WARNING said ``Redis at ... unreachable (ClusterError: TTL
    exhausted.)`` while every node answered."""
    client = sync_redis_from_settings(Settings({"REDIS_URL": migrating.url}), connect_timeout=5)
    try:
        with pytest.raises(redis.exceptions.ClusterError) as refused:
            client.exists(MOVED_KEY, NEVER_KEY)
    finally:
        client.close()
    said = outage(refused.value)
    assert "unreachable" not in said and "a slot of the crawl is migrating" in said, said
    assert outage(ConnectionError("gone")) == "unreachable (ConnectionError: gone)"


@pytest.fixture
def buckets_moving(tmp_path: Path) -> Iterator[tuple[redis_servers.Cluster, list[str]]]:
    """A crawl of 20 URLs seen in the exact set's buckets, its slot migrating to a node just
    added: the buckets moved already, their meta hash (the key the scripts declare) not."""
    cluster = redis_servers.start_cluster(tmp_path / "cluster", replicas=0)
    try:
        urls = [f"https://shop.example/item/{i}" for i in range(20)]
        pushed = scrapy_ha("--redis-url", cluster.url, "push", "--create", "catalogue", *urls)
        assert pushed.returncode == 0, pushed.stderr
        new = _joined(cluster, tmp_path / "new")
        meta = "ha:{catalogue}:buckets"
        source = cluster.owner_of(meta)
        assert source is not None
        with source.client() as src, new.client() as dst:
            buckets = [k for k in src.keys(meta + ":*") if k.count(b":") == 4]
            assert len(buckets) >= 10
            slot = key_slot(meta.encode())
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", _id(src))
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", _id(dst))
            src.execute_command("MIGRATE", "127.0.0.1", new.port, "", 0, 5000, "KEYS", *buckets)
        yield cluster, urls
    finally:
        cluster.stop()


def test_forget_waits_for_a_slot_that_migrates(buckets_moving):
    """``seen forget`` ran its script where the buckets' meta hash was, and the buckets had
    moved: "Script attempted to access a non local key", some URLs forgotten before it. It
    is refused whole (TRYAGAIN) until the slot has moved, and says why."""
    cluster, urls = buckets_moving
    done = scrapy_ha("--redis-url", cluster.url, "seen", "forget", "-y", "catalogue", *urls)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "non local key" not in done.stderr
    assert "a slot of the crawl is migrating" in done.stderr, done.stderr
    meta = cluster.owner_of("ha:{catalogue}:buckets")
    assert meta is not None
    with meta.client() as c:
        assert c.hget("ha:{catalogue}:buckets", "n") == b"20"  # nothing forgotten
