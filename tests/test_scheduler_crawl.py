"""In-process crawls against the demo site and a real Redis."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.codec import encode_request
from scrapy_ha.keys import Keys
from tests import backqueues
from tests.spiders import CatalogueSpider, PathsSpider

if TYPE_CHECKING:
    import redis


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


def settings(redis_url: str, **extra):
    return {
        "SCHEDULER": "scrapy_ha.Scheduler",
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.3,
        "LOG_LEVEL": "INFO",
        **extra,
    }


def state(client: redis.Redis, spider: str) -> dict[str, int]:
    keys = Keys("ha", spider)
    return {
        "pending": backqueues.count(client, keys),
        "leased": client.zcard(keys.leased),
        "delayed": client.zcard(keys.delayed),
        "dead": client.zcard(keys.dead),
        "payloads": client.hlen(keys.payload),
    }


@deferred_f_from_coro_f
async def test_a_crawl_gets_every_item_once_and_leaves_redis_clean(redis_url, redis_client, site):
    crawler = get_crawler(CatalogueSpider, settings(redis_url))
    await crawler.crawl_async(base_url=site.url)
    assert sorted(i["id"] for i in crawler.spider.items) == list(range(1, 51))
    stats = crawler.stats.get_stats()
    assert stats["finish_reason"] == "finished"
    assert stats["ha/enqueued"] == stats["ha/leased"] == stats["ha/acked"] == 55
    assert set(site.hits().values()) == {1}
    # SCHEDULER_PERSIST is False: the last worker clears the crawl's working keys; the
    # counters stay for the operator, the record that the crawl finished, and its runs (a
    # later start is its next run); and the workers seen, when a renewal stamped them (kept a
    # week for `scrapy-ha report`: a crawl slower than a renewal interval has it)
    left = set(redis_client.keys("ha:{catalogue}:*")) - {b"ha:{catalogue}:seen"}
    assert sorted(left) == [
        b"ha:{catalogue}:finish",
        b"ha:{catalogue}:run",
        b"ha:{catalogue}:seq",
        b"ha:{catalogue}:stats",
        b"ha:{catalogue}:stats:domain",
        b"ha:{catalogue}:stats:min",
    ]


@deferred_f_from_coro_f
async def test_every_way_a_request_can_end_acks_it(redis_url, redis_client, site):
    crawler = get_crawler(PathsSpider, settings(redis_url, SCHEDULER_PERSIST=True))
    await crawler.crawl_async(base_url=site.url)
    spider = crawler.spider
    assert sorted(spider.outcomes) == sorted(
        [
            f"ok {site.url}/item/1",
            f"ok {site.url}/item/2",
            f"error {site.url}/status/404",
            f"error {site.url}/status/500",
            f"error {site.url}/item/4?drop",
        ]
    )
    stats = crawler.stats.get_stats()
    # 6 start requests (the offsite one is dropped before it is scheduled),
    # 1 retry of /status/500 and 1 redirect target
    assert stats["ha/enqueued"] == stats["ha/acked"] == stats["ha/leased"] == 8
    assert stats["spider_exceptions/ValueError"] == 1
    assert stats["offsite/filtered"] == 1
    assert state(redis_client, "paths") == {
        "pending": 0,
        "leased": 0,
        "delayed": 0,
        "dead": 0,
        "payloads": 0,
    }


@deferred_f_from_coro_f
async def test_two_workers_share_one_crawl_and_start_urls_are_enqueued_once(
    redis_url, redis_client, site_factory
):
    site = site_factory("--pages", "10", "--per-page", "10", "--delay", "0.05")
    worker = settings(redis_url, HA_PREFETCH=2, CONCURRENT_REQUESTS=2)
    crawlers = [get_crawler(CatalogueSpider, worker) for _ in range(2)]
    await asyncio.gather(*(c.crawl_async(base_url=site.url) for c in crawlers))
    item_lists = [c.spider.items for c in crawlers]
    ids = sorted(i["id"] for items in item_lists for i in items)
    assert ids == list(range(1, 101))
    assert all(items for items in item_lists), "both workers took part"
    assert set(site.hits().values()) == {1}


@deferred_f_from_coro_f
async def test_graceful_stop_releases_buffered_leases_at_once(
    redis_url, redis_client, site_factory
):
    site = site_factory("--pages", "20", "--per-page", "10", "--delay", "0.05")
    crawler = get_crawler(
        CatalogueSpider, settings(redis_url, HA_PREFETCH=20, CONCURRENT_REQUESTS=4)
    )
    crawling = asyncio.ensure_future(crawler.crawl_async(base_url=site.url))
    while crawler.spider is None or len(crawler.spider.items) < 10:
        await asyncio.sleep(0.05)
    await crawler.stop_async()
    await crawling
    stats = crawler.stats.get_stats()
    assert stats["finish_reason"] == "shutdown"
    assert stats["ha/released"] > 0
    left = state(redis_client, "catalogue")
    assert left["leased"] == 0 and left["pending"] >= stats["ha/released"]
    # a second worker finishes the crawl: nothing lost, nothing crawled twice
    second = get_crawler(CatalogueSpider, settings(redis_url))
    await second.crawl_async(base_url=site.url)
    assert sorted(i["id"] for i in crawler.spider.items + second.spider.items) == list(
        range(1, 201)
    )
    assert set(site.hits().values()) == {1}


@deferred_f_from_coro_f
async def test_unreachable_redis_fails_fast_naming_the_masked_url(redis_server, caplog):
    from tests.conftest import free_port

    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    crawler = get_crawler(CatalogueSpider, settings(url, HA_CONNECT_TIMEOUT=2, HA_START_TIMEOUT=0))
    started = time.monotonic()
    with caplog.at_level(logging.ERROR):
        await crawler.crawl_async(base_url="http://127.0.0.1:9")
    assert time.monotonic() - started < 20
    assert crawler.stats.get_value("finish_reason") == "ha_start_failed"
    assert crawler.spider is None  # what makes `scrapy crawl` exit with 1
    [message] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert f"redis://:***@127.0.0.1:{url.rsplit(':', 1)[1]}" in message
    assert "hunter2" not in caplog.text


#: scrapy-ha's retry middleware in place of Scrapy's, with a bad setting of its own.
RETRY_JITTER_TOO_HIGH = {
    "DOWNLOADER_MIDDLEWARES": {
        "scrapy.downloadermiddlewares.retry.RetryMiddleware": None,
        "scrapy_ha.retry.RetryMiddleware": 550,
    },
    "HA_RETRY_JITTER": 2,
}


@pytest.mark.parametrize("scheduler", ["scrapy-ha", "scrapy"])
@deferred_f_from_coro_f
async def test_a_middlewares_bad_setting_refuses_the_start(
    scheduler, redis_url, redis_client, site, caplog
):
    """Built before the scheduler, a middleware said its bad setting in a traceback and the
    crawl had no finish reason; with Scrapy's own scheduler on Scrapy 2.16 it closed before
    the engine started and ``scrapy crawl`` exited 0. scrapy-ha's scheduler then opens no
    session (nothing written to Redis)."""
    extra = settings(redis_url) if scheduler == "scrapy-ha" else {"LOG_LEVEL": "INFO"}
    crawler = get_crawler(CatalogueSpider, {**extra, **RETRY_JITTER_TOO_HIGH})
    with caplog.at_level(logging.ERROR):
        await crawler.crawl_async(base_url=site.url)
    assert crawler.stats.get_value("finish_reason") == "ha_start_failed"
    assert crawler.spider is None  # what makes `scrapy crawl` exit with 1
    [message] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert message.startswith("scrapy-ha cannot start: HA_RETRY_JITTER=2"), message
    assert not site.hits()  # nothing downloaded
    if scheduler == "scrapy-ha":
        assert not await asyncio.to_thread(redis_client.dbsize)


@deferred_f_from_coro_f
async def test_a_corrupt_queue_entry_is_dead_lettered_and_the_crawl_goes_on(
    redis_url, redis_client, site
):
    keys = Keys("ha", "catalogue")
    spider = CatalogueSpider(base_url=site.url)
    good = encode_request(
        spider.start_urls
        and __import__("scrapy").Request(site.url + "/item/7", callback=spider.parse_item),
        spider,
    )
    planted = [("900", b"\x80\x04garbage"), ("901", good), ("902", b'{"v":1}'), ("903", b"")]
    backqueues.plant(redis_client, keys, planted)  # "903": no payload at all
    crawler = get_crawler(CatalogueSpider, settings(redis_url, SCHEDULER_PERSIST=True))
    await crawler.crawl_async(base_url=site.url)
    items = crawler.spider.items
    assert 7 in [i["id"] for i in items] and len(items) == 51  # 50 + the injected /item/7
    assert crawler.stats.get_value("ha/dead/corrupt") == 3
    dead = {k.decode(): json.loads(v) for k, v in redis_client.hgetall(keys.dead_info).items()}
    assert set(dead) == {"900", "902", "903"}
    assert all(
        d["class"] == "corrupt" and "corrupt queue entry" in d["reason"] for d in dead.values()
    )


@deferred_f_from_coro_f
async def test_a_redis_that_never_answers_does_not_hang_the_crawl(caplog):
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections, never answers
    url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
    crawler = get_crawler(CatalogueSpider, settings(url, HA_CONNECT_TIMEOUT=1, HA_START_TIMEOUT=0))
    started = time.monotonic()
    try:
        with caplog.at_level(logging.ERROR):
            await crawler.crawl_async(base_url="http://127.0.0.1:9")
    finally:
        silent.close()
    assert time.monotonic() - started < 15
    assert crawler.stats.get_value("finish_reason") == "ha_start_failed"
    assert f"{url} within HA_START_TIMEOUT=0s (1 attempt(s) of HA_CONNECT_TIMEOUT=1s" in caplog.text


@deferred_f_from_coro_f
async def test_redis_restarted_mid_crawl_reconnects_and_loses_nothing(tmp_path, site_factory):
    from tests.conftest import RedisServer

    server = RedisServer(tmp_path / "redis", appendonly=True)
    server.start()
    site = site_factory("--pages", "20", "--per-page", "10", "--delay", "0.02")
    crawler = get_crawler(CatalogueSpider, settings(server.url, CONCURRENT_REQUESTS=4))
    crawling = asyncio.ensure_future(crawler.crawl_async(base_url=site.url))
    try:
        deadline = time.monotonic() + 120
        while crawler.spider is None or len(crawler.spider.items) < 30:
            assert not crawling.done() and time.monotonic() < deadline, "no 30 items in 120 s"
            await asyncio.sleep(0.02)
        server.stop()  # graceful: the AOF is written
        # restart once the crawl has seen Redis down (no fixed wait: start() waits for the port)
        deadline = time.monotonic() + 60
        while not crawler.stats.get_value("ha/redis_errors"):
            assert not crawling.done() and time.monotonic() < deadline, "no Redis error seen"
            await asyncio.sleep(0.02)
        server.start()  # same port, same data
        await crawling
    finally:
        server.stop()
    stats = crawler.stats.get_stats()
    assert stats["ha/redis_errors"] >= 1
    assert sorted(i["id"] for i in crawler.spider.items) == list(range(1, 201))
