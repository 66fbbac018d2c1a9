"""A crawl survives its Redis failing over, and runs on a Redis Cluster: real servers, real
sentinels, a real cluster, all on loopback.

- A primary demoted under a plain ``redis://`` URL answers READONLY: the worker takes it as
  Redis being away (reconnect with backoff), not as bad data, and goes on once the URL
  reaches a primary again.
- Behind Sentinel, the primary is SIGKILLed mid-crawl: the sentinels promote the replica,
  the worker asks them again, and the crawl finishes with every item. Redis replicates
  asynchronously, so the new primary holds a prefix of the old one's writes: what the lost
  suffix did (acks, leases) is redone when those leases expire, and children the old
  primary confirmed but the new one lacks are stored again before any ack (see
  tests/test_failover_lost_children.py). The test asserts no item is lost and duplicates
  stay below the requests that can be in flight (prefetch plus concurrency).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.store.connection import jittered
from scrapy_ha.store.functions import LIBRARY_NAME
from tests import redis_servers
from tests.dupefilter import dupefilter_settings
from tests.spiders import CatalogueSpider
from tests.test_cli import scrapy_ha

if TYPE_CHECKING:
    from pathlib import Path

#: Requests a worker can have taken from Redis at once: the bound on duplicates.
IN_FLIGHT = 8
#: Lease length of the crawls here: an outage longer than this expires what a worker holds.
LEASE_TIME = 4
#: Seconds a scenario may take on a loaded 2-core machine before the test gives up.
DEADLINE = 120.0


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


def crawl_settings(url: str, **extra: Any) -> dict[str, Any]:
    return {
        "SCHEDULER": "scrapy_ha.Scheduler",
        "REDIS_URL": url,
        "HA_IDLE_TIMEOUT": 0.5,
        "HA_LEASE_TIME": LEASE_TIME,
        "HA_LEASE_RENEW_INTERVAL": 1,
        "HA_RECLAIM_INTERVAL": 1,
        "HA_RECONNECT_MAX_DELAY": 1,
        "HA_PREFETCH": IN_FLIGHT // 2,
        "CONCURRENT_REQUESTS": IN_FLIGHT // 2,
        "LOG_LEVEL": "INFO",
        **dupefilter_settings(),
        **extra,
    }


async def until(check: Any, what: str, timeout: float = DEADLINE) -> None:
    """Poll *check* (run in a thread: it may talk to Redis) until true, with a deadline."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(check):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def caught_up(primary: Any) -> Any:
    """A check for :func:`until`: every replica of *primary* (a sync client) acknowledged
    what the primary had written by now. Not ``WAIT``: it counts only the writes of the
    connection that sends it, and a fresh connection has none, so it returns at once."""
    written = primary.info("replication")["master_repl_offset"]

    def check() -> bool:
        info = primary.info("replication")
        replicas = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
        return bool(replicas) and all(int(r["offset"]) >= written for r in replicas)

    return check


#: Workers sharing the crawl through an outage or a failover.
WORKERS = 2


def scraped(crawlers: list[Any]) -> list[dict[str, Any]]:
    return [item for c in crawlers if c.spider is not None for item in c.spider.items]


def assert_nothing_lost(spider: Any, total: int, duplicates: int = IN_FLIGHT) -> None:
    ids = [item["id"] for item in spider.items]
    assert sorted(set(ids)) == list(range(1, total + 1))
    assert len(ids) - total <= duplicates, f"{len(ids) - total} duplicates"


# -- a demoted primary under a plain URL ----------------------------------------------------


@deferred_f_from_coro_f
async def test_readonly_from_a_demoted_primary_is_redis_away_not_bad_data(
    tmp_path: Path, site_factory, caplog
):
    site = site_factory("--pages", "5", "--per-page", "10", "--delay", "0.2")
    primary = redis_servers.start(tmp_path / "a")
    replica = redis_servers.start(tmp_path / "b", "--replicaof", "127.0.0.1", str(primary.port))
    a, b = primary.client(), replica.client()
    try:
        await until(lambda: a.info("replication")["connected_slaves"] == 1, "the replica")
        crawler = get_crawler(
            CatalogueSpider, crawl_settings(f"redis://127.0.0.1:{primary.port}/0")
        )
        crawl = asyncio.ensure_future(crawler.crawl_async(base_url=site.url))
        await until(lambda: crawler.spider is not None and len(crawler.spider.items) >= 5, "items")
        # FAILOVER waits for the replica to have every write: nothing is lost in Redis
        a.execute_command("FAILOVER")  # the URL now names a read-only replica
        await until(lambda: "read-only replica" in caplog.text, "the READONLY warning")
        await until(lambda: b.info("replication")["connected_slaves"] == 1, "the replica")
        b.execute_command("FAILOVER")  # the URL reaches a primary again (as after a DNS move)
        await asyncio.wait_for(crawl, DEADLINE)
    finally:
        for server in (primary, replica):
            server.kill()
        a.close()
        b.close()
    assert "refused a scrapy-ha command" not in caplog.text
    warned = [r for r in caplog.records if "read-only replica" in r.getMessage()]
    assert warned and all(r.levelno == logging.WARNING for r in warned)
    assert_nothing_lost(crawler.spider, 50, duplicates=0)


@deferred_f_from_coro_f
async def test_a_primary_without_its_replica_makes_the_crawl_wait_not_fail(
    tmp_path: Path, site_factory, caplog
):
    # min-replicas-to-write 1: the primary refuses writes (NOREPLICAS) once its replica is
    # gone; the workers wait for a replica as for Redis being away
    site = site_factory("--pages", "5", "--per-page", "10", "--delay", "0.2")
    guard = ("--min-replicas-to-write", "1", "--min-replicas-max-lag", "1")
    primary = redis_servers.start(tmp_path / "a", *guard)
    follow = ("--replicaof", "127.0.0.1", str(primary.port))
    replica = redis_servers.start(tmp_path / "b", *follow)
    a = primary.client()

    def good_replicas() -> int:
        return int(a.info("replication").get("min_slaves_good_slaves", 0))

    url = f"redis://127.0.0.1:{primary.port}/0"
    crawlers = [
        get_crawler(CatalogueSpider, crawl_settings(url, HA_WORKER_ID=f"w{i}"))
        for i in range(WORKERS)
    ]
    try:
        await until(lambda: good_replicas() == 1, "the replica")
        crawl = asyncio.gather(*(c.crawl_async(base_url=site.url) for c in crawlers))
        await until(lambda: len(scraped(crawlers)) >= 5, "items")
        replica.kill()
        await until(lambda: "too few replicas" in caplog.text, "the NOREPLICAS warning")
        # writes refused for longer than a lease: the workers finish what they hold (no ack
        # lands) and every lease they held expires in Redis
        await asyncio.sleep(LEASE_TIME + 1)
        replica = redis_servers.start(tmp_path / "c", *follow)
        await asyncio.wait_for(crawl, DEADLINE)
    finally:
        for server in (primary, replica):
            server.kill()
        a.close()
    assert "refused a scrapy-ha command" not in caplog.text
    # back from the outage, each worker renews and acks what it held, and none reclaims for
    # a lease period: no worker takes (and redoes) what another one finished meanwhile
    ids = [item["id"] for item in scraped(crawlers)]
    assert sorted(ids) == list(range(1, 51)), f"{len(ids) - len(set(ids))} duplicates"
    assert all(c.stats.get_value("ha/reclaimed") is None for c in crawlers)


# -- Sentinel -----------------------------------------------------------------------------


@pytest.fixture
def sentinels(tmp_path: Path):
    found = redis_servers.start_sentinels(tmp_path / "sentinel", "--appendonly", "yes")
    yield found
    found.stop()


async def crawl_through_failover(found: redis_servers.SentinelSet, site: Any, total: int):
    """Crawl with two workers, SIGKILL the primary mid-crawl, wait for the crawl to end;
    print what it cost."""
    crawlers = [
        get_crawler(CatalogueSpider, crawl_settings(found.url, HA_WORKER_ID=f"w{i}"))
        for i in range(WORKERS)
    ]
    crawl = asyncio.gather(*(c.crawl_async(base_url=site.url) for c in crawlers))
    await until(lambda: len(scraped(crawlers)) >= 5, "items")
    old = found.primary_port()
    # the replica caught up first: on a loaded machine it can lag a second or more, and
    # what the lost suffix did is redone (duplicates beyond the bound below; what it
    # stored is not lost: tests/test_failover_lost_children.py)
    with found.primary.client() as primary:
        await until(caught_up(primary), "the replica to catch up", timeout=10)
    with found.replica.client() as replica:  # the sync function came by replication too
        assert LIBRARY_NAME in str(replica.function_list())
    found.primary.kill()
    killed, killed_at = time.monotonic(), len(scraped(crawlers))

    def acks() -> int:
        return sum(c.stats.get_value("ha/acked", 0) for c in crawlers)

    await asyncio.to_thread(redis_servers.wait_promoted, found, old)
    promoted, acked = time.monotonic(), acks()
    await until(lambda: acks() > acked or crawl.done(), "acks")
    print(  # the figures docs/scaling.md quotes (pytest -s)
        f"failover: promoted {promoted - killed:.1f} s after the kill, acks again "
        f"{time.monotonic() - killed:.1f} s after it"
    )
    await asyncio.wait_for(crawl, DEADLINE)
    assert killed_at < total, "the crawl ended before the primary was killed"
    items = scraped(crawlers)
    print(f"failover: {len(items) - total} duplicate item(s) of {total}")
    ids = [item["id"] for item in items]
    assert sorted(set(ids)) == list(range(1, total + 1)), "items lost"
    assert len(ids) - total <= IN_FLIGHT * WORKERS, f"{len(ids) - total} duplicates"
    return crawlers


@deferred_f_from_coro_f
async def test_workers_follow_a_sentinel_failover_and_lose_nothing(sentinels, site_factory):
    site = site_factory("--pages", "5", "--per-page", "10", "--delay", "0.2")
    crawlers = await crawl_through_failover(sentinels, site, 50)
    for crawler in crawlers:
        assert crawler.stats.get_value("finish_reason") == "finished"
    # both saw the primary go (the scheduler's loop or its lease keeper) and came back
    assert all(c.stats.get_value("ha/redis_errors", 0) >= 1 for c in crawlers)


@pytest.mark.long
@deferred_f_from_coro_f
async def test_a_long_crawl_follows_a_sentinel_failover(sentinels, site_factory):
    site = site_factory("--pages", "40", "--per-page", "25", "--delay", "0.05")
    await crawl_through_failover(sentinels, site, 1000)


# -- Cluster ------------------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path):
    found = redis_servers.start_cluster(tmp_path / "cluster")
    yield found
    found.stop()


@deferred_f_from_coro_f
async def test_a_crawl_on_a_three_master_cluster(cluster, site):
    settings = crawl_settings(cluster.url, SCHEDULER_PERSIST=True)
    crawler = get_crawler(CatalogueSpider, settings)
    await crawler.crawl_async(base_url=site.url)
    assert_nothing_lost(crawler.spider, 50)
    assert len(crawler.spider.items) == 50
    assert len(cluster.masters()) == 3
    result = await asyncio.to_thread(
        scrapy_ha, "--redis-url", cluster.url, "status", "catalogue", "--json"
    )
    assert result.returncode == 0, result.stderr
    assert '"fingerprints": 55' in result.stdout


def test_a_reconnect_wait_is_jittered_between_half_and_the_whole_delay():
    waits = [jittered(8.0) for _ in range(200)]
    assert all(4.0 <= w <= 8.0 for w in waits)
    assert len(set(waits)) > 100  # workers that lost Redis together come back apart


@pytest.mark.long
@deferred_f_from_coro_f
async def test_a_crawl_follows_a_cluster_failover_when_its_master_is_killed(cluster, site_factory):
    site = site_factory("--pages", "5", "--per-page", "10", "--delay", "0.2")
    crawler = get_crawler(CatalogueSpider, crawl_settings(cluster.url))
    crawl = asyncio.ensure_future(crawler.crawl_async(base_url=site.url))
    await until(lambda: crawler.spider is not None and len(crawler.spider.items) >= 5, "items")
    owner = cluster.owner_of("ha:{catalogue}:ready")
    owner.kill()
    killed_at = len(crawler.spider.items)
    promoted = lambda: cluster.owner_of("ha:{catalogue}:ready") not in (None, owner)  # noqa: E731
    await until(promoted, "a replica promoted to master")
    await asyncio.wait_for(crawl, DEADLINE)
    assert killed_at < 50, "the crawl ended before its master was killed"
    assert crawler.stats.get_value("finish_reason") == "finished"
    assert_nothing_lost(crawler.spider, 50)
