"""A planned failover (``SENTINEL FAILOVER``, the primary still running) with
``min-replicas-to-write 1`` on the primary and its replica: real servers, real sentinels.

The sentinels promote the replica at once but turn the old primary into a replica only
some 10 s later; until then the old primary is a master. Without ``min-replicas-to-write``
it takes the workers' writes, and they are lost when it follows the new primary (a QA run:
528 pages crawled twice and 6 dead letters lost). With it, the old primary refuses every
write (NOREPLICAS) from the moment its replica is promoted, and so does the new primary
until the old one follows it: the workers wait (about 11 s) and lose nothing.

A NOREPLICAS reply closes the connection (redis-py closes a connection whose command
raised a ConnectionError), so a Sentinel client's next connection asks the sentinels.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

import pytest
import redis
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.store.connection import redis_from_settings, sync_redis_from_settings
from tests import redis_servers
from tests.spiders import CatalogueSpider
from tests.test_cli import scrapy_ha
from tests.test_redis_failover import IN_FLIGHT, WORKERS, crawl_settings, scraped, until

if TYPE_CHECKING:
    from pathlib import Path

#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")

GUARD = ("--min-replicas-to-write", "1", "--min-replicas-max-lag", "10")


@pytest.fixture
def lone_guarded_primary(tmp_path: Path):
    server = redis_servers.start(tmp_path / "a", *GUARD)  # no replica: writes refused
    yield server
    server.kill()


@deferred_f_from_coro_f
async def test_noreplicas_closes_the_async_connection(lone_guarded_primary):
    url = f"redis://127.0.0.1:{lone_guarded_primary.port}/0"
    client = redis_from_settings(Settings({"REDIS_URL": url}), connect_timeout=5)
    try:
        first = await client.client_id()
        with pytest.raises(redis.exceptions.ConnectionError, match="too few replicas"):
            await client.set("k", 1)
        # a new connection: behind Sentinel it would have asked the sentinels again
        assert await client.client_id() != first
    finally:
        await client.aclose()


def test_noreplicas_closes_the_sync_connection(lone_guarded_primary):
    url = f"redis://127.0.0.1:{lone_guarded_primary.port}/0"
    with sync_redis_from_settings(Settings({"REDIS_URL": url}), connect_timeout=5) as client:
        first = client.client_id()
        with pytest.raises(redis.exceptions.ConnectionError, match="too few replicas"):
            client.set("k", 1)
        assert client.client_id() != first


@pytest.fixture
def guarded_sentinels(tmp_path: Path):
    found = redis_servers.start_sentinels(tmp_path / "sentinel", *GUARD)
    yield found
    found.stop()


def role(server: redis_servers.Server) -> str:
    with server.client() as c:
        return str(c.execute_command("ROLE")[0], "ascii")


@deferred_f_from_coro_f
async def test_a_planned_sentinel_failover_loses_nothing_with_min_replicas_to_write(
    guarded_sentinels, site_factory
):
    found = guarded_sentinels
    site = site_factory("--pages", "10", "--per-page", "10", "--delay", "0.2")
    total = 100
    crawlers = [
        get_crawler(
            CatalogueSpider, crawl_settings(found.url, HA_WORKER_ID=f"w{i}", SCHEDULER_PERSIST=True)
        )
        for i in range(WORKERS)
    ]

    def acks() -> int:
        return sum(c.stats.get_value("ha/acked", 0) for c in crawlers)

    crawl = asyncio.gather(*(c.crawl_async(base_url=site.url) for c in crawlers))
    await until(lambda: acks() >= 10, "acks")
    with redis.Redis(port=found.sentinels[0].port) as sentinel:
        sentinel.execute_command("SENTINEL", "FAILOVER", redis_servers.SERVICE)
    acked_at = acks()
    # the old primary still runs, a master until the sentinels turn it into a replica
    await until(lambda: role(found.replica) == "master", "the replica promoted")
    await until(lambda: role(found.primary) == "slave", "the old primary demoted")
    await asyncio.wait_for(crawl, 120)
    assert acked_at < total, "the crawl ended before the failover"
    for crawler in crawlers:
        assert crawler.stats.get_value("finish_reason") == "finished"
    ids = [item["id"] for item in scraped(crawlers)]
    assert sorted(set(ids)) == list(range(1, total + 1)), "items lost"
    assert len(ids) - total <= IN_FLIGHT * WORKERS, f"{len(ids) - total} duplicates"
    # and the primary now serving holds the crawl as done (the acks of the old primary's
    # last seconds, lost with them, would leave requests pending or leased there)
    result = await asyncio.to_thread(
        scrapy_ha, "--redis-url", found.url, "status", "catalogue", "--json"
    )
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    print("planned failover:", status["pending"], status["leased"], status["totals"])
    assert (status["pending"], status["leased"], status["delayed"]) == (0, 0, 0)
    assert status["totals"]["acked"] > total
