"""Real crawls with the Bloom-filter dupefilter (``HA_DUPEFILTER = "bloom"``), and the
back-pressure before Redis is full (``HA_REDIS_MEMORY_HIGH`` / ``_LOW``): a worker SIGKILLed
loses nothing, a sharded crawl keeps one filter per shard, a worker of the other kind is
refused, ``scrapy-ha status`` and the exporter say what the filter and the memory do, and a
crawl held back by Redis's memory leases nothing until it falls below the low mark, then
finishes with nothing lost. (``make test-bloom`` runs the whole kill, shard, failover and
conformance suites with a Bloom filter too.)"""

from __future__ import annotations

import asyncio
import json
import re
import signal
from typing import TYPE_CHECKING

import pytest
import redis
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.demo import harness
from scrapy_ha.keys import Keys
from scrapy_ha.ops.crawls import read_crawls
from scrapy_ha.store.bloom_state import bloom_state
from tests import backqueues
from tests.dupefilter import BLOOM
from tests.spiders import CatalogueSpider
from tests.test_cli import scrapy_ha
from tests.test_crash import PER_KILL, check_nothing_lost, count_lines, wait_for_items, worker
from tests.test_redis_failover import assert_nothing_lost, crawl_settings
from tests.test_shards_crawl import status

if TYPE_CHECKING:
    from tests.conftest import Site


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


#: Megabytes of ballast that put Redis above the back-pressure mark in the test.
BALLAST_MB = 8


def test_sigkill_one_of_two_workers_loses_nothing_with_a_bloom_filter(
    redis_url, redis_client, site_factory, tmp_path
):
    pages, per_page = 100, 20  # 2,100 URLs: the filter grows from 1,000 to a second layer
    site = site_factory("--pages", str(pages), "--per-page", str(per_page), "--chains", "5")
    items = tmp_path / "items.jl"
    victim = worker(redis_url, site.url, items, tmp_path / "victim.log", **BLOOM)
    wait_for_items(items, 1, victim)
    survivor = worker(redis_url, site.url, items, tmp_path / "survivor.log", **BLOOM)
    wait_for_items(items, 700, victim)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    log = tmp_path / "survivor.log"
    assert survivor.wait(timeout=180) == 0, log.read_text()[-3000:]
    logs = (tmp_path / "victim.log", log)
    check_nothing_lost(items, pages * per_page, site.hits(), PER_KILL, logs=logs)
    # what the filter itself expects to have lost: far below one URL (tests/dupefilter.py)
    [expected] = re.findall(r"'ha/dupefilter/false_positives': ([0-9.e+-]+)", log.read_text())
    assert 0 < float(expected) < 1e-6
    assert redis_client.exists("ha:{catalogue}:bloom") == 0  # finished: cleared whole
    assert redis_client.keys("ha:{catalogue}:bloom*") == []
    assert redis_client.exists("ha:{catalogue}:dupefilter") == 0


@deferred_f_from_coro_f
async def test_a_sharded_crawl_keeps_one_filter_per_shard(redis_url, site: Site):
    settings = crawl_settings(redis_url, SCHEDULER_PERSIST=True, HA_SHARDS=3, **BLOOM)
    crawler = get_crawler(CatalogueSpider, settings)
    await crawler.crawl_async(base_url=site.url)
    assert_nothing_lost(crawler.spider, 50)
    assert all(n == 1 for n in site.hits().values())
    stats = crawler.stats.get_stats()
    assert stats["ha/dupefilter/urls"] == 55 and 0 < stats["ha/dupefilter/error_rate"] < 1e-6
    assert stats["ha/dupefilter/false_positives"] < 1e-6
    client = redis.Redis.from_url(redis_url)
    states = [bloom_state(client.hgetall(f"ha:{{catalogue:{i}}}:bloom")) for i in range(3)]
    assert all(s is not None and s.urls > 0 for s in states)
    assert sum(s.urls for s in states if s) == 55 and client.keys("*:dupefilter") == []
    doc = await asyncio.to_thread(status, redis_url, "catalogue")
    assert doc["fingerprints"] == 55 and doc["dupefilter"]["kind"] == "bloom"
    assert doc["dupefilter"]["urls"] == 55 and doc["dupefilter"]["error_asked"] == 1e-12
    # the text line says what the JSON says: every shard's filter, not shard 0's alone
    shown = await asyncio.to_thread(scrapy_ha, "--redis-url", redis_url, "status", "catalogue")
    mb = f"{doc['dupefilter']['bytes'] / 2**20:,.1f} MB"
    assert f"bloom: 55 URLs in 3 shards of at most 1 layer(s), {mb}" in shown.stdout
    [numbers] = read_crawls(client, "ha", ["catalogue"])
    assert len(numbers.blooms) == 3 and 0 < numbers.dupefilter_error < 1e-6
    client.close()
    again = get_crawler(CatalogueSpider, settings)  # the same crawl again, its next run:
    await again.crawl_async(base_url=site.url)  # the start page again, the rest all seen
    assert sum(site.hits().values()) == 56 and site.hits()["/list/1"] == 2


@deferred_f_from_coro_f
async def test_a_worker_of_the_other_kind_is_refused_at_open(redis_url, site: Site, caplog):
    exact = get_crawler(CatalogueSpider, crawl_settings(redis_url, SCHEDULER_PERSIST=True))
    await exact.crawl_async(base_url=site.url)
    bloom = get_crawler(CatalogueSpider, crawl_settings(redis_url, SCHEDULER_PERSIST=True, **BLOOM))
    await bloom.crawl_async(base_url=site.url)
    assert "HA_DUPEFILTER='bloom' but the crawl of catalogue in Redis has an exact set" in (
        caplog.text
    )
    assert sum(site.hits().values()) == 55  # the second crawled nothing


@deferred_f_from_coro_f
async def test_status_and_metrics_show_the_filter(redis_url, site: Site):
    settings = crawl_settings(redis_url, SCHEDULER_PERSIST=True, HA_DUPEFILTER="bloom")
    await get_crawler(CatalogueSpider, settings).crawl_async(base_url=site.url)
    shown = await asyncio.to_thread(scrapy_ha, "--redis-url", redis_url, "status", "catalogue")
    assert "dupefilter  bloom: 55 URLs in 1 layer(s), 36.1 MB" in shown.stdout, shown.stdout
    assert "at most 9.5e-07 (asked 1e-06)" in shown.stdout
    client = redis.Redis.from_url(redis_url)
    [numbers] = read_crawls(client, "ha", ["catalogue"])
    assert numbers.stats.fingerprints == 55 and 0 < numbers.dupefilter_error < 1e-20
    assert client.memory_usage("ha:{catalogue}:bloom:0:0") < 36.2 * 2**20  # sized to a class
    client.close()
    # a push from outside the project (HA_DUPEFILTER "set" there) takes the crawl's kind
    # from its claim (a worker of the exact set is refused: see below)
    pushed = await asyncio.to_thread(
        scrapy_ha, "--redis-url", redis_url, "push", "catalogue", f"{site.url}/x"
    )
    assert pushed.returncode == 0 and "1 added" in pushed.stdout, pushed.stderr


def _renewal(client: redis.Redis) -> None:
    """Wait for the worker's next heartbeat (it is alive, and read what it reads)."""

    def beat() -> float:
        return client.zrange("ha:{catalogue}:workers", 0, 0, withscores=True)[0][1]

    before = beat()
    harness.wait_for(lambda: beat() > before, "a renewal", 30)


def _used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def test_a_crawl_held_back_by_redis_memory_goes_on_below_the_low_mark(
    redis_url, redis_client, site_factory, tmp_path
):
    pages, per_page = 10, 10
    site = site_factory("--pages", str(pages), "--per-page", str(per_page))
    base = _used(redis_client)
    redis_client.setrange("ballast", BALLAST_MB * 2**20 - 1, b"\0")  # above the high mark
    marks = {
        "HA_REDIS_MEMORY_HIGH": str(base + 4 * 2**20),
        "HA_REDIS_MEMORY_LOW": str(base + 2**21),
    }
    items, log = tmp_path / "items.jl", tmp_path / "worker.log"
    live = worker(redis_url, site.url, items, log, **marks)
    try:
        harness.wait_for(lambda: "leases nothing new" in log.read_text(), "the warning", 60)
        harness.wait_for(
            lambda: backqueues.count(redis_client, Keys("ha", "catalogue")) > 0, "seeds", 30
        )
        _renewal(redis_client)
        assert count_lines(items) == 0 and redis_client.zcard("ha:{catalogue}:leased") == 0
        assert redis_client.exists("ha:{catalogue}:pressure")
        shown = scrapy_ha("--redis-url", redis_url, "status", "catalogue").stdout
        assert "back-pressure" in shown and "workers lease nothing new" in shown, shown
        [numbers] = read_crawls(redis_client, "ha", ["catalogue"])
        assert numbers.backpressure
        # between the marks the worker stays held (it stopped and started around the high
        # mark, were the low one not read): once it read the memory there, nothing leased
        high, low = int(marks["HA_REDIS_MEMORY_HIGH"]), int(marks["HA_REDIS_MEMORY_LOW"])
        other = _used(redis_client) - redis_client.memory_usage("ballast")
        assert other < low, (other, low)
        size = low + (high - low) // 4 - other  # its allocation rounds up by a quarter at most
        redis_client.setrange("ballast2", size - 1, b"\0")  # above the high mark meanwhile
        redis_client.delete("ballast")

        def read_between() -> bool:
            doc = redis_client.get("ha:{catalogue}:pressure")
            return doc is None or json.loads(doc)["used"] < high

        harness.wait_for(read_between, "a read of the memory between the marks", 30)
        assert redis_client.exists("ha:{catalogue}:pressure"), "it went on above the low mark"
        _renewal(redis_client)
        assert count_lines(items) == 0 and redis_client.zcard("ha:{catalogue}:leased") == 0
        redis_client.delete("ballast2")  # memory falls below the low mark
        assert live.wait(120) == 0
    finally:
        if live.poll() is None:
            live.kill()
    text = log.read_text()
    assert "below HA_REDIS_MEMORY_LOW, this worker leases again" in text
    assert "'ha/backpressure/held': 1" in text
    check_nothing_lost(items, pages * per_page, site.hits(), 0)
    assert redis_client.exists("ha:{catalogue}:pressure") == 0


def test_no_maxmemory_and_fractions_mean_no_back_pressure(
    redis_url, redis_client, site_factory, tmp_path
):
    site = site_factory("--pages", "3", "--per-page", "5")
    assert redis_client.config_get("maxmemory")["maxmemory"] == "0"
    items, log = tmp_path / "items.jl", tmp_path / "worker.log"
    marks = {"HA_REDIS_MEMORY_HIGH": "0.000001", "HA_REDIS_MEMORY_LOW": "0.0000005"}
    done = worker(redis_url, site.url, items, log, **marks)
    assert done.wait(120) == 0
    assert count_lines(items) == 15 and "leases nothing new" not in log.read_text()


@deferred_f_from_coro_f
async def test_a_first_layer_that_cannot_fit_in_redis_is_refused_at_start(tmp_path, site, caplog):
    """A QA run: the default filter's 36 MB first layer in a 20 MB Redis; every write of the
    crawl was refused (an ERROR a second, for ever). The worker is refused at start, naming
    the sizes and the settings; a filter that fits starts."""
    import logging

    from tests import redis_servers

    server = redis_servers.start(tmp_path / "redis", "--maxmemory", "20mb")
    try:
        url = f"redis://127.0.0.1:{server.port}/0"
        caplog.set_level(logging.ERROR)
        default = {**crawl_settings(url), "HA_DUPEFILTER": "bloom"}  # 10 M URLs at 1e-6
        crawler = get_crawler(CatalogueSpider, default)
        await crawler.crawl_async(base_url=site.url)
        assert crawler.stats.get_value("finish_reason") == "ha_start_failed"
        said = "\n".join(r.getMessage() for r in caplog.records)
        assert "its first layer takes 36." in said and "maxmemory 20.0 MB" in said, said
        assert not server.client().zcard("ha:{catalogue}:workers")
        # each shard has its own filter: four of 14.4 MB (a review: a check of one passed)
        server.client().flushall()
        caplog.clear()
        sharded = {**default, "HA_DUPEFILTER_CAPACITY": 4_000_000, "HA_SHARDS": 4}
        crawler = get_crawler(CatalogueSpider, sharded)
        await crawler.crawl_async(base_url=site.url)
        assert crawler.stats.get_value("finish_reason") == "ha_start_failed"
        said = "\n".join(r.getMessage() for r in caplog.records)
        assert "its first layers (4 shards) take 57.8 MB" in said, said
        server.client().flushall()
        small = {**default, "HA_DUPEFILTER_CAPACITY": 100_000}
        crawler = get_crawler(CatalogueSpider, small)
        await crawler.crawl_async(base_url=site.url)
        assert crawler.stats.get_value("finish_reason") == "finished"
    finally:
        server.kill()


@deferred_f_from_coro_f
async def test_a_worker_refused_at_start_leaves_a_finished_crawl_finished(tmp_path, site):
    """A review finding: the refused worker's join deleted the finished crawl's 'done'
    record, so a worker with another HA_SHARDS was then refused as if the crawl ran."""
    from tests import redis_servers

    server = redis_servers.start(tmp_path / "redis", "--maxmemory", "20mb")
    try:
        url = f"redis://127.0.0.1:{server.port}/0"
        small = {**crawl_settings(url), "HA_DUPEFILTER": "bloom", "HA_DUPEFILTER_CAPACITY": 10**5}
        crawler = get_crawler(CatalogueSpider, small)
        await crawler.crawl_async(base_url=site.url)
        assert crawler.stats.get_value("finish_reason") == "finished"
        assert server.client().get("ha:{catalogue}:finish") == b"done"
        crawler = get_crawler(CatalogueSpider, {**small, "HA_DUPEFILTER_CAPACITY": 10**7})
        await crawler.crawl_async(base_url=site.url)  # a first layer of 36 MB: refused
        assert crawler.stats.get_value("finish_reason") == "ha_start_failed"
        assert server.client().get("ha:{catalogue}:finish") == b"done"
        crawler = get_crawler(CatalogueSpider, {**small, "HA_SHARDS": 2})
        await crawler.crawl_async(base_url=site.url)  # takes the finished crawl over
        assert crawler.stats.get_value("finish_reason") == "finished"
    finally:
        server.kill()


@deferred_f_from_coro_f
async def test_a_refused_worker_leaves_a_crawl_another_worker_joined_running(redis_url):
    """A review: the record was written back whenever no registration was live, and a
    sharded crawl's registrations expire (its heartbeats are in shard 0): a worker refused
    after another joined made the running crawl read as finished, and a third worker with
    another HA_SHARDS took its layout over."""
    import asyncio

    import redis.asyncio

    from scrapy_ha.store.join import join_crawl, leave_crawl

    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await client.set("ha:{race}:finish", "done")
        joined = {"shards": 4, "registration_ms": 1, "sender": ""}
        first = await join_crawl(client, "ha", "race", worker="a", **joined)
        assert first.finished
        await join_crawl(client, "ha", "race", worker="b", **joined)  # runs the crawl
        await asyncio.sleep(0.01)  # b's registration expired (its heartbeats are elsewhere)
        await leave_crawl(client, "ha", "race", first, "a")  # refused, its registration gone
        assert await client.get("ha:{race}:finish") is None
    finally:
        await client.delete("ha:{race}:finish", "ha:{race}:joins", "ha:{race}:shards")
        await client.aclose()


class SpoilingMeta(CatalogueSpider):
    """Deletes its Bloom filter's capacity once idle, as the worker closes (a worker's adds
    write it again)."""

    name = "spoiling"

    @classmethod
    def from_crawler(cls, crawler, *args, **kwargs):
        from scrapy import signals

        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.spoil, signal=signals.spider_idle)
        return spider

    spoiled = "bloom"

    def spoil(self):
        client, keys = redis.Redis.from_url(self.settings["REDIS_URL"]), Keys("ha", self.name)
        if self.spoiled == "bloom":
            client.hdel(keys.bloom, "capacity")
        else:  # the exact set's buckets (a review: a ValueError, not a BloomMetaError)
            client.hset(keys.buckets, "buckets", "x")


@pytest.mark.parametrize("spoiled", ["bloom", "buckets"])
@deferred_f_from_coro_f
async def test_a_bloom_meta_spoilt_at_the_end_does_not_stop_the_close(redis_url, site, spoiled):
    """The worker's close reads the filter's figures for its stats: a meta it cannot read
    (no capacity: unreadable, where the tools showed no filter at all) ended the close
    there, and the worker stayed registered."""
    SpoilingMeta.spoiled = spoiled
    settings = {**crawl_settings(redis_url), "SCHEDULER_PERSIST": True}
    if spoiled == "bloom":
        settings.update(BLOOM)
    crawler = get_crawler(SpoilingMeta, settings)
    await asyncio.wait_for(crawler.crawl_async(base_url=site.url), 120)
    assert crawler.stats.get_value("finish_reason") == "finished"
    meta = redis.Redis.from_url(redis_url).hgetall(getattr(Keys("ha", "spoiling"), spoiled))
    assert meta and (b"capacity" not in meta or meta.get(b"buckets") == b"x"), meta
    # the close went on: the worker left (before, it stayed registered: flush refused)
    assert not redis.Redis.from_url(redis_url).zcard(Keys("ha", "spoiling").workers)
