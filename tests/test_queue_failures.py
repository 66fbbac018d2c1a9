"""A failure while handling one entry costs that entry alone: the worker's loop goes on
and no lease leaks (in-process crawls against the demo site and a real Redis)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis.asyncio
from scrapy import signals
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry
from tests import backqueues
from tests.spiders import CatalogueSpider, FaultSpider

#: Short leases so that a leaked lease shows within the test (reclaimed, then poison).
FAST_LEASES = {
    "HA_LEASE_TIME": 3,
    "HA_LEASE_RENEW_INTERVAL": 1,
    "HA_HEARTBEAT_TTL": 3,
    "HA_RECLAIM_INTERVAL": 1,
    "HA_IDLE_TIMEOUT": 0.5,
    "CLOSESPIDER_TIMEOUT": 25,
    "SCHEDULER_PERSIST": True,
    "LOG_LEVEL": "INFO",
}


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


def dead_info(redis_client, spider: str) -> list[dict[str, Any]]:
    return [json.loads(v) for v in redis_client.hvals(Keys("ha", spider).dead_info)]


@deferred_f_from_coro_f
async def test_a_payload_that_breaks_the_decoder_costs_that_entry_alone(
    redis_url, redis_client, site
):
    # extras that are not an object: the decoder fails with something else than CodecError
    bad = json.dumps({"v": 1, "u": site.url + "/item/7", "x": []}).encode()
    queue = RedisQueue(redis.asyncio.Redis.from_url(redis_url), Keys("ha", "catalogue"))
    await queue.enqueue([NewEntry(b"", 100, bad)])  # leased first, in the first batch
    await queue.client.aclose()
    crawler = get_crawler(
        CatalogueSpider, {"SCHEDULER": "scrapy_ha.Scheduler", "REDIS_URL": redis_url, **FAST_LEASES}
    )
    await crawler.crawl_async(base_url=site.url)
    stats = crawler.stats.get_stats()
    assert stats["finish_reason"] == "finished"
    assert sorted(i["id"] for i in crawler.spider.items) == list(range(1, 51))
    assert stats["ha/dead/corrupt"] == 1
    assert "ha/reclaimed" not in stats  # no lease of the batch leaked
    assert "ha/dead/poison" not in stats
    (info,) = dead_info(redis_client, "catalogue")
    assert info["class"] == "corrupt"
    keys = Keys("ha", "catalogue")
    assert (backqueues.pending(redis_client, keys), redis_client.zcard(keys.leased)) == ([], 0)


class UnstorableMetaMiddleware:
    """Puts a value in meta that cannot be stored (a handle), as some middlewares do."""

    def process_request(self, request: Any) -> None:
        if "/status/" in request.url:
            request.meta["handle"] = object()


@deferred_f_from_coro_f
async def test_an_end_of_lease_that_fails_costs_that_entry_alone(redis_url, redis_client, site):
    settings = {
        "ADDONS": {"scrapy_ha.Addon": 0},
        "REDIS_URL": redis_url,
        "DOWNLOADER_MIDDLEWARES": {"tests.test_queue_failures.UnstorableMetaMiddleware": 100},
        "HA_RETRY_JITTER": 0,
        "HA_RETRY_BACKOFF_BASE": 0.3,
        **FAST_LEASES,
    }
    paths = ("/status/500", "/status/404", *(f"/item/{i}" for i in range(1, 9)))
    crawler = get_crawler(FaultSpider, settings)
    await crawler.crawl_async(base_url=site.url, paths=paths)
    stats = crawler.stats.get_stats()
    assert stats["finish_reason"] == "finished"
    assert sorted(crawler.spider.ok) == sorted(f"/item/{i}" for i in range(1, 9))
    assert "ha/reclaimed" not in stats
    assert "ha/dead/poison" not in stats
    infos = dead_info(redis_client, "faults")
    # the retry and the dead-letter of the two pages could not store their request: each
    # page is dead-lettered with the reason, and the crawl went on
    assert len(infos) == 2
    assert all("handle" in info["reason"] for info in infos), infos
    keys = Keys("ha", "faults")
    assert redis_client.zcard(keys.leased) == 0


@deferred_f_from_coro_f
async def test_the_lease_keeper_thread_ends_with_the_crawl(redis_url, site):
    import threading

    def keepers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "scrapy-ha-keeper"]

    crawler = get_crawler(
        CatalogueSpider, {"SCHEDULER": "scrapy_ha.Scheduler", "REDIS_URL": redis_url, **FAST_LEASES}
    )
    during: list[int] = []

    def on_item() -> None:
        during.append(len(keepers()))

    crawler.signals.connect(on_item, signal=signals.item_scraped)  # (a weak reference)
    await crawler.crawl_async(base_url=site.url)
    assert crawler.stats.get_value("finish_reason") == "finished"
    assert set(during) == {1}  # one renewal thread while the crawl runs
    assert not keepers()  # and none after it
