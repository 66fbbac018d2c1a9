"""The operator's tools on a Redis Cluster (three real masters made with ``redis-cli
--cluster create``), where a QA run of a sharded crawl found: every scrape of the metrics
exporter failed (a script in a cluster pipeline, which redis-py refuses), the health checks
and the back-pressure read ``INFO`` of one node only (redis-py sends a server command to
its default node: a full or evicting node holding a shard went unseen), and the CLI printed
a traceback when a master was down."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import redis
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from scrapy_ha.config.memory import MemoryConfig
from scrapy_ha.demo import harness
from scrapy_ha.keys import Keys
from scrapy_ha.ops.metrics import CrawlCollector
from scrapy_ha.ops.stats import read_crawl_stats
from scrapy_ha.scheduler.remote import Remote
from scrapy_ha.scheduler.session.pressure import Pressure
from scrapy_ha.store.connection import redis_from_settings, sync_redis_from_settings
from scrapy_ha.store.health import redis_health
from scrapy_ha.store.sharding import make_queue
from tests import redis_servers
from tests.cli_seed import _run, scrapy_ha
from tests.test_unreadable_names import _samples

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

URLS = [f"http://a{n}.example/page" for n in range(12)]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[redis_servers.Cluster]:
    found = redis_servers.start_cluster(tmp_path / "cluster", replicas=0)
    yield found
    found.stop()


def _pushed(cluster: redis_servers.Cluster) -> None:
    """A crawl of three shards, one per master's share of the slots, with URLS pending."""
    done = scrapy_ha("push", "wide", "--create", *URLS, "--shards", "3", "--redis-url", cluster.url)
    assert done.returncode == 0, done.stderr


async def _problems(url: str) -> list[str]:
    client = redis_from_settings(Settings({"REDIS_URL": url}), connect_timeout=5)
    try:
        return await redis_health(client)
    finally:
        await client.aclose()


async def _held(url: str) -> bool:
    """Does a worker's memory check hold it back (back-pressure, default marks)?"""
    client = redis_from_settings(Settings({"REDIS_URL": url}), connect_timeout=5)
    try:
        queue = make_queue(client, "ha", "pressure", 1, worker="w0")
        remote = Remote()
        await Pressure(MemoryConfig(), get_crawler().stats, remote, url).check(queue)
        return remote.held
    finally:
        await client.aclose()


def test_the_exporter_reads_a_sharded_crawl_on_a_cluster(cluster):
    _pushed(cluster)
    client = sync_redis_from_settings(Settings({"REDIS_URL": cluster.url}), connect_timeout=5)
    try:
        samples = _samples(CrawlCollector(client, "ha", discovery_ttl=0))
    finally:
        client.close()
    assert samples[("scrapy_ha_requests", ("pending", "wide"))] == len(URLS)
    assert samples[("scrapy_ha_crawl_read_error", ("wide",))] == 0


def test_every_node_of_a_cluster_is_checked(cluster):
    """An evicting policy and a node at its maxmemory, set on each master in turn: each is
    said, whichever node redis-py asks by default; the exporter shows that node's memory."""

    exporter = sync_redis_from_settings(Settings({"REDIS_URL": cluster.url}), connect_timeout=5)
    for port in cluster.masters():
        node = redis.Redis(port=port)
        used = int(node.info("memory")["used_memory"])
        node.config_set("maxmemory", used + 1024)
        # (volatile-*: it evicts keys with a TTL alone, and refuses other writes when full;
        # an allkeys-* policy takes them, evicting, so "at or over" is not said of it)
        node.config_set("maxmemory-policy", "volatile-lru")
        try:
            said = _run(_problems(cluster.url))
            samples = _samples(CrawlCollector(exporter, "ha", discovery_ttl=0))
        finally:
            node.config_set("maxmemory-policy", "noeviction")
            node.config_set("maxmemory", 0)
            node.close()
        assert any("maxmemory-policy" in p and "volatile-lru" in p for p in said), (port, said)
        assert any("maxmemory" in p and "at or over" in p for p in said), (port, said)
        assert samples[("scrapy_ha_redis_memory_max_bytes", ())] == used + 1024, port
    exporter.close()


def test_a_command_on_a_cluster_with_a_master_down_says_so(cluster):
    """A master serving a shard, not the first node of the URL (which answers), killed and
    marked failed by the others: the command says Redis went away, exit 2, no traceback."""
    _pushed(cluster)
    first = cluster.nodes[0]
    owners = [cluster.owner_of(f"ha:{{wide:{i}}}:ready") for i in range(3)]
    owner = next(o for o in owners if o is not None and o is not first)
    owner.proc.kill()
    owner.proc.wait()

    def failed() -> bool:
        with first.client() as c:
            return b"cluster_state:fail" in c.execute_command("CLUSTER", "INFO")

    harness.wait_for(failed, "the cluster to mark the master failed", 60, 0.2)
    done = scrapy_ha("status", "wide", "--redis-url", cluster.url)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert "run it again once Redis is back" in done.stderr, done.stderr


def test_a_worker_holds_back_when_any_node_nears_its_maxmemory(cluster):
    """Each master in turn near its maxmemory: the worker holds back, whichever node
    redis-py asks by default (before, a shard on another node filled up unseen)."""

    assert not _run(_held(cluster.url))
    for port in cluster.masters():
        node = redis.Redis(port=port)
        node.config_set("maxmemory", int(node.info("memory")["used_memory"]) + 1024)
        try:
            assert _run(_held(cluster.url)), port
        finally:
            node.config_set("maxmemory", 0)
            node.close()


def test_read_crawl_stats_reads_a_crawl_on_a_cluster(cluster):
    """The public blocking reader (``scrapy_ha.stats.read_crawl_stats``): its pipeline ran a
    script, which redis-py's cluster pipelines refuse (every crawl was unreadable)."""
    _pushed(cluster)
    client = sync_redis_from_settings(Settings({"REDIS_URL": cluster.url}), connect_timeout=5)
    try:
        stats = read_crawl_stats(client, Keys("ha", "wide"))
    finally:
        client.close()
    assert stats.pending == len(URLS)


def test_a_primary_without_persistence_is_said_beside_one_with_it(cluster):
    """``save`` is read per primary: one with RDB snapshots hid another with none."""
    first, second = cluster.masters()[:2]
    with redis.Redis(port=first) as node:
        node.config_set("save", "3600 1")
    try:
        said = _run(_problems(cluster.url))
    finally:
        with redis.Redis(port=first) as node:
            node.config_set("save", "")
    assert any("neither AOF nor RDB" in p for p in said), said
    assert second


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[redis_servers.Cluster]:
    found = redis_servers.start_cluster(tmp_path / "cluster", replicas=1)
    yield found
    found.stop()


def _replicas(cluster: redis_servers.Cluster) -> list[redis_servers.Server]:
    replicas = []
    for node in cluster.alive():
        with node.client() as c:
            if c.execute_command("ROLE")[0] == b"slave":
                replicas.append(node)
    return replicas


def test_replicas_are_neither_checked_nor_needed(replicated):
    """A replica ignores maxmemory: one near it holds nothing back; one down (a data write
    still works) fails no start, no memory check and no scrape (every node was asked)."""
    _pushed(replicated)
    replica, other = _replicas(replicated)[:2]
    with other.client() as c:
        c.config_set("maxmemory", int(c.info("memory")["used_memory"]) + 1024)
        c.config_set("maxmemory-policy", "allkeys-lru")
    replica.proc.kill()
    replica.proc.wait()
    assert not _run(_held(replicated.url))
    said = _run(_problems(replicated.url))
    assert not any("maxmemory" in p for p in said), said
    exporter = sync_redis_from_settings(Settings({"REDIS_URL": replicated.url}), connect_timeout=5)
    try:
        samples = _samples(CrawlCollector(exporter, "ha", discovery_ttl=0))
    finally:
        exporter.close()
    assert samples[("scrapy_ha_redis_up", ())] == 1
    assert samples[("scrapy_ha_requests", ("pending", "wide"))] == len(URLS)


def test_a_primary_that_cannot_be_read_keeps_the_hold_and_is_said(cluster):
    """A primary near its maxmemory holds the workers back; once its INFO is refused to the
    crawl's user (ACL users are per node), the hold stays and the health checks name it
    (a review: it was left out, the workers leased again, and status said all was well)."""
    port = cluster.masters()[0]
    node = redis.Redis(port=port)
    node.config_set("maxmemory", int(node.info("memory")["used_memory"]) + 1024)

    async def scene() -> tuple[bool, bool, list[str]]:
        client = redis_from_settings(Settings({"REDIS_URL": cluster.url}), connect_timeout=5)
        try:
            queue = make_queue(client, "ha", "pressure", 1, worker="w0")
            remote = Remote()
            pressure = Pressure(MemoryConfig(), get_crawler().stats, remote, cluster.url)
            await pressure.check(queue, now=0.0)
            held = remote.held
            node.execute_command("ACL", "SETUSER", "default", "-info")
            await pressure.check(queue, now=60.0)
            return held, remote.held, await redis_health(client)
        finally:
            await client.aclose()

    try:
        before, after, said = _run(scene())
    finally:
        node.execute_command("ACL", "SETUSER", "default", "+info")
        node.config_set("maxmemory", 0)
        node.close()
    assert before and after
    assert any(f"primary 127.0.0.1:{port} could not be read" in p for p in said), said
