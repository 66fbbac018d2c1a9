"""A worker warns once about a Redis that can lose the crawl (eviction, no persistence, too
old), naming the setting and the fix; ``scrapy-ha status`` says the same on its "redis" line."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest
import redis
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.store.health import node_problems
from tests import redis_servers
from tests.spiders import CatalogueSpider
from tests.test_cli import scrapy_ha

if TYPE_CHECKING:
    from pathlib import Path

SAFE = {
    "redis_version": "7.0.15",
    "maxmemory": 0,
    "maxmemory_policy": "noeviction",
    "aof_enabled": 1,
}
NO_AOF = {**SAFE, "aof_enabled": 0}
REPLICATED = {**SAFE, "role": "master", "connected_slaves": 1}


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


@pytest.mark.parametrize(
    ("info", "saves", "said"),
    [
        (SAFE, {"3600 1"}, []),
        (SAFE, {""}, []),
        (NO_AOF, None, []),  # CONFIG GET refused: not a problem of the crawl
        (NO_AOF, {""}, ["neither AOF nor RDB"]),
        # RDB alone: a crash takes the crawl back to a snapshot, start requests lost
        (NO_AOF, {"3600 1 300 100 60 10000"}, ["AOF is off (appendonly no, RDB snapshots"]),
        ({**SAFE, "redis_version": "6.0.9"}, {"3600 1"}, ["Redis 6.0.9 is older than 6.2"]),
        ({**SAFE, "maxmemory_policy": "allkeys-lru"}, {"3600 1"}, []),  # no maxmemory
        ({**SAFE, "maxmemory": 10**8, "maxmemory_policy": "allkeys-lru"}, {"1 1"}, ["queued"]),
        ({**SAFE, "maxmemory": 10**8, "maxmemory_policy": "volatile-ttl"}, {"1 1"}, ["checkp"]),
        ({**SAFE, "maxmemory": 20 * 2**20, "used_memory": 19 * 2**20 - 1}, {"1 1"}, []),
        (  # a write of a worker's round takes it over: refused (the NEAR_FULL margin)
            {**SAFE, "maxmemory": 20 * 2**20, "used_memory": 20 * 2**20 - 2**18},
            {"1 1"},
            ["used_memory 19.8 MB is within 0.2 MB of maxmemory 20.0 MB: Redis refuses every"],
        ),
        ({**SAFE, "maxmemory": 400 * 2**20, "used_memory": 395 * 2**20}, {"1 1"}, []),
        ({**SAFE, "maxmemory": 400 * 2**20, "used_memory": 397 * 2**20}, {"1 1"}, ["within 3"]),
        (
            {**SAFE, "maxmemory": 20 * 2**20, "used_memory": 40 * 2**20},
            {"1 1"},
            ["used_memory 40.0 MB is at or over maxmemory 20.0 MB: Redis refuses writes"],
        ),
        # a primary with replicas: min-replicas-to-write, or a planned failover loses writes
        (REPLICATED, {"1 1"}, ["a primary with 1 replica(s) and no min-replicas-to-write"]),
        ({**REPLICATED, "min_slaves_good_slaves": 1}, {"1 1"}, []),
        ({**REPLICATED, "cluster_enabled": 1}, {"1 1"}, []),  # a cluster's failover waits
        ({**REPLICATED, "role": "slave"}, {"1 1"}, []),
    ],
)
def test_what_a_server_is_warned_about(info, saves, said):
    problems = node_problems(info, saves)
    assert len(problems) == len(said)
    for problem, words in zip(problems, said, strict=True):
        assert words in problem


@pytest.fixture
def evicting_redis(tmp_path: Path):
    server = redis_servers.start(
        tmp_path / "redis", "--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"
    )
    yield server
    server.kill()


@deferred_f_from_coro_f
async def test_a_worker_warns_once_and_status_says_it(evicting_redis, site, caplog):
    url = f"redis://127.0.0.1:{evicting_redis.port}/0"
    settings = {
        "SCHEDULER": "scrapy_ha.Scheduler",
        "REDIS_URL": url,
        "HA_IDLE_TIMEOUT": 0.3,
        "SCHEDULER_PERSIST": True,
    }
    caplog.set_level(logging.WARNING, logger="scrapy_ha")
    for _ in range(2):  # a second crawl in the same process: said once
        await get_crawler(CatalogueSpider, settings).crawl_async(base_url=site.url)
    warnings = [r.getMessage() for r in caplog.records if r.name == "scrapy_ha.store.health"]
    assert len(warnings) == 2, warnings
    assert all(w.startswith(f"Redis at {url}: ") for w in warnings)
    assert "maxmemory-policy is allkeys-lru" in warnings[0] and "noeviction" in warnings[0]
    assert "appendonly yes" in warnings[1]
    result = scrapy_ha("--redis-url", url, "status", "catalogue")
    (line,) = [x for x in result.stdout.splitlines() if x.split()[:1] == ["redis"]]
    assert "allkeys-lru" in line and "neither AOF nor RDB" in line


def test_rdb_snapshots_alone_are_warned_about(tmp_path):
    """A restart from an RDB snapshot (AOF off: Redis's default) takes the crawl back to the
    snapshot: a QA run restored one taken before the start requests were stored (a crash
    before ``save 60 1`` first saved) and the workers ended ``finished`` with 1,589 of 3,300
    pages never crawled. ``status`` said ``redis ok`` and no worker warned."""
    server = redis_servers.start(tmp_path / "redis", "--save", "60 1")
    try:
        url = f"redis://127.0.0.1:{server.port}/0"
        server.client().set("ha:{books}:seq", 1)  # a crawl exists
        result = scrapy_ha("--redis-url", url, "status", "books")
        (line,) = [x for x in result.stdout.splitlines() if x.split()[:1] == ["redis"]]
        assert "AOF is off" in line and "save 60 1" in line, line
        assert "start requests" in line and "appendonly yes" in line, line
    finally:
        server.kill()


def test_status_says_ok_for_a_safe_redis(tmp_path):
    server = redis_servers.start(tmp_path / "redis", "--appendonly", "yes")
    try:
        url = f"redis://127.0.0.1:{server.port}/0"
        server.client().set("ha:{books}:seq", 1)  # a crawl exists
        result = scrapy_ha("--redis-url", url, "status", "books")
        lines = [x.split() for x in result.stdout.splitlines()]
        assert ["redis", "ok"] in lines, result.stdout + result.stderr
    finally:
        server.kill()


def test_status_says_a_redis_over_its_maxmemory(tmp_path):
    """A QA run: Redis at 40 MB of a 20 MB maxmemory refused every write, the back-pressure
    mark (a key) included, and ``status`` read as healthy (``redis ok``, no back-pressure)."""
    server = redis_servers.start(tmp_path / "redis", "--appendonly", "yes")
    try:
        url = f"redis://127.0.0.1:{server.port}/0"
        client = server.client()
        client.set("ha:{books}:seq", 1)  # a crawl exists
        client.set("ballast", "x" * 2**21)  # 2 MB
        client.config_set("maxmemory", 2**20)  # 1 MB: below what it uses
        assert int(client.info("memory")["used_memory"]) >= 2**20
        result = scrapy_ha("--redis-url", url, "status", "books")
        (line,) = [x for x in result.stdout.splitlines() if x.split()[:1] == ["redis"]]
        assert "at or over maxmemory 1.0 MB: Redis refuses writes" in line, line
    finally:
        server.kill()


def test_status_says_a_primary_whose_replica_a_planned_failover_would_leave_behind(tmp_path):
    """A QA run: a planned SENTINEL FAILOVER lost the workers' writes of 11 s on a primary
    without min-replicas-to-write (docs/scaling.md); nothing said so."""
    primary = redis_servers.start(tmp_path / "primary", "--appendonly", "yes")
    replica = redis_servers.start(
        tmp_path / "replica", "--appendonly", "yes", "--replicaof", "127.0.0.1", str(primary.port)
    )
    try:
        client = primary.client()
        client.set("ha:{books}:seq", 1)  # a crawl exists
        url = f"redis://127.0.0.1:{primary.port}/0"
        redis_servers.harness.wait_for(
            lambda: client.info("replication")["connected_slaves"] == 1, "the replica", 30
        )
        result = scrapy_ha("--redis-url", url, "status", "books")
        (line,) = [x for x in result.stdout.splitlines() if x.split()[:1] == ["redis"]]
        assert "no min-replicas-to-write (or a min-replicas-max-lag of 0" in line, line
        assert "a planned failover" in line, line
        # set, but turned off by a lag of 0: said so (it named the one set alone; a review)
        client.config_set("min-replicas-to-write", 1)
        client.config_set("min-replicas-max-lag", 0)
        result = scrapy_ha("--redis-url", url, "status", "books")
        (line,) = [x for x in result.stdout.splitlines() if x.split()[:1] == ["redis"]]
        assert "a min-replicas-max-lag of 0, which turns it off" in line, line
        client.config_set("min-replicas-max-lag", 10)
        result = scrapy_ha("--redis-url", url, "status", "books")
        assert ["redis", "ok"] in [x.split() for x in result.stdout.splitlines()], result.stdout
    finally:
        replica.kill()
        primary.kill()


def test_status_says_a_redis_a_write_away_from_its_maxmemory(tmp_path):
    """A QA run: a crawl 344 KB under its 200 MB maxmemory had every round refused (OOM) for
    a minute, and ``status`` said ``redis ok``: a command's own arguments count in
    ``used_memory`` while Redis checks it."""
    server = redis_servers.start(tmp_path / "redis", "--appendonly", "yes")
    try:
        url = f"redis://127.0.0.1:{server.port}/0"
        client = server.client()
        client.set("ha:{books}:seq", 1)  # a crawl exists
        for i in range(64):  # 4 MB in small writes (a large one's query buffer is freed later)
            client.set(f"ballast:{i}", "x" * 2**16)
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory", used + 600 * 2**10)  # 600 KB to spare
        writer = server.client()  # closed after: its refused write's buffer goes with it
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            writer.set("round", "x" * 2**20)  # a 1 MB write (a round of new requests)
        writer.close()
        result = scrapy_ha("--redis-url", url, "status", "books")
        (line,) = [x for x in result.stdout.splitlines() if x.split()[:1] == ["redis"]]
        assert "is within 0." in line and "Redis refuses every write" in line, line
    finally:
        server.kill()


def test_status_says_no_refused_writes_of_a_redis_that_evicts(tmp_path):
    """A QA run: with allkeys-lru Redis stays just under its maxmemory and takes every write
    (it evicts keys), and ``status`` said "Redis refuses every write ... nothing is lost"
    beside the eviction warning that says the crawl loses requests."""
    server = redis_servers.start(
        tmp_path / "redis", "--appendonly", "yes", "--maxmemory-policy", "allkeys-lru"
    )
    try:
        url = f"redis://127.0.0.1:{server.port}/0"
        client = server.client()
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory", used + 4 * 2**20)
        for i in range(128):  # 8 MB in small writes: Redis evicts to stay under 4 MB more
            client.set(f"ballast:{i}", "x" * 2**16)
        assert int(client.info("stats")["evicted_keys"]) > 0
        client.set("ha:{books}:seq", 1)  # a crawl exists (a write taken, keys evicted)
        result = scrapy_ha("--redis-url", url, "status", "books")
        (line,) = [x for x in result.stdout.splitlines() if x.split()[:1] == ["redis"]]
        assert "maxmemory-policy is allkeys-lru" in line, line
        assert "refuses every write" not in line and "at or over" not in line, line
    finally:
        server.kill()
