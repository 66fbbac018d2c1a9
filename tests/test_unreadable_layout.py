"""Which hash tags are a sharded crawl's shards, and a shard count that cannot be read: only
``<crawl>:<N>`` with N below the shards the crawl's layout spans is one of its shards (a
crawl named ``k3:7`` beside ``k3`` of 3 shards is a crawl of its own), and a crawl whose
``ha:{S}:shards`` is none scrapy-ha writes is listed with the reason, not dropped (read as
one shard, it looked empty). A real redis-server, the real exporter and dashboard."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.ops.crawls import discover, read_every_crawl
from scrapy_ha.store.sharding import check_shard_count, make_queue
from tests.test_cli import scrapy_ha
from tests.test_dashboard_api import dashboard
from tests.test_dashboard_pages import entry
from tests.test_metrics import exporter_factory as exporter_factory  # a fixture
from tests.test_metrics import value


async def two_crawls(url: str) -> None:
    """``k3``, 3 shards, 30 requests, and ``k3:7``, unsharded, 2 requests."""
    client = redis.asyncio.Redis.from_url(url)
    try:
        k3 = make_queue(client, "ha", "k3", 3)
        await check_shard_count(k3)
        await k3.sync(enqueue=[entry(f"http://k3.example/{i}") for i in range(30)])
        beside = make_queue(client, "ha", "k3:7", 1)
        await beside.sync(enqueue=[entry(f"http://k37.example/{i}") for i in range(2)])
    finally:
        await client.aclose()


def pending(reading_crawls: list) -> dict[str, int]:
    return {c.spider: c.states["pending"] for c in reading_crawls}


@deferred_f_from_coro_f
async def test_a_crawl_named_like_a_shard_past_the_shard_count_is_a_crawl_of_its_own(
    redis_url, exporter_factory
):
    await two_crawls(redis_url)
    client = redis.Redis.from_url(redis_url)
    try:
        assert discover(client, "ha") == ["k3", "k3:7"]
        assert pending(read_every_crawl(client, "ha", ["k3", "k3:7"]).crawls) == {
            "k3": 30,
            "k3:7": 2,
        }
    finally:
        client.close()
    samples = exporter_factory(redis_url).scrape()
    assert value(samples, "scrapy_ha_crawls") == 2
    assert value(samples, "scrapy_ha_requests", spider="k3:7", state="pending") == 2

    def listed() -> None:
        with dashboard(redis_url) as http:
            crawls = http.get("/api/crawls").json()["crawls"]
            assert [(c["spider"], c["pending"]) for c in crawls] == [("k3", 30), ("k3:7", 2)]

    await asyncio.to_thread(listed)


@pytest.mark.parametrize("stored", ["abc", "1", "-3", "3 2", "3 2000"])
@deferred_f_from_coro_f
async def test_an_unreadable_shard_count_lists_the_crawl_with_the_reason(
    redis_url, exporter_factory, stored: str
):
    await two_crawls(redis_url)
    client = redis.Redis.from_url(redis_url)
    held = f"ha:{{k3}}:shards holds {stored!r}, not a shard count"
    try:
        client.set("ha:{k3}:shards", stored)
        assert discover(client, "ha") == ["k3"]  # its span unknown: k3:7 may be its shard 7
        reading = read_every_crawl(client, "ha", ["k3", "k3:7"])
        assert pending(reading.crawls) == {"k3:7": 2}
        assert list(reading.unreadable) == ["k3"]
        assert reading.unreadable["k3"].startswith(held), reading.unreadable
        assert "set it to the crawl's HA_SHARDS" in reading.unreadable["k3"]
    finally:
        client.close()
    samples = exporter_factory(redis_url).scrape()
    assert value(samples, "scrapy_ha_crawls") == 1
    assert value(samples, "scrapy_ha_crawl_read_error", spider="k3") == 1

    def listed_apart() -> None:
        with dashboard(redis_url) as http:
            api = http.get("/api/crawls").json()
            assert api["crawls"] == []
            assert api["unreadable"]["k3"].startswith(held), api["unreadable"]
            page = http.get("/crawls/k3")
            assert page.status_code == 409 and "ha:{k3}:shards holds" in page.text

    await asyncio.to_thread(listed_apart)


@pytest.mark.parametrize(
    "command", [["status", "k3"], ["dlq", "list", "k3"], ["flush", "k3", "--yes"]]
)
@deferred_f_from_coro_f
async def test_a_command_on_a_crawl_whose_shard_count_is_unreadable_names_the_key(
    redis_url, command: list[str]
):
    """The command names the key and what it holds, as the listings do. Before, it read
    the crawl as one shard, whose keys a sharded crawl has none of, and said the crawl had
    no key at all (check the spider name, --prefix and --redis-url), exit code 1."""
    await two_crawls(redis_url)
    client = redis.Redis.from_url(redis_url)
    try:
        client.set("ha:{k3}:shards", "abc")
        keys = sorted(client.keys("ha:{k3:*"))
        done = await asyncio.to_thread(scrapy_ha, "--redis-url", redis_url, *command)
        assert done.returncode == 2, done
        assert "ha:{k3}:shards holds 'abc', not a shard count" in done.stderr, done.stderr
        assert "set it to the crawl's HA_SHARDS" in done.stderr
        assert sorted(client.keys("ha:{k3:*")) == keys and keys  # nothing flushed
    finally:
        client.close()
