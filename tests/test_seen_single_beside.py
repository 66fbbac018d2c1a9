"""A worker of a version before the Bloom filter and the time slices (2026-12-01) that joins
a crawl keeping them writes its single set ``dupefilter`` beside them: the versions do not
see each other's URLs. A running worker says so once, as it does beside the buckets, and a
worker of the crawl's own kind still starts (it was refused, told to take the other kind,
which was refused too: no worker of this version could join the crawl)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from tests.spiders import CatalogueSpider
from tests.test_seen_buckets_joined import KEYS, SAID, JoinedSpider, Said

pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")

BASE = {
    "SCHEDULER": "scrapy_ha.Scheduler",
    "HA_IDLE_TIMEOUT": 0.3,
    "HA_RECLAIM_INTERVAL": 0.5,
    "SCHEDULER_PERSIST": True,
    "LOG_LEVEL": "INFO",
}
KINDS = [{"HA_DUPEFILTER": "bloom"}, {"HA_DUPEFILTER_TTL": 3600}]


def _said() -> tuple[Said, logging.Logger]:
    JoinedSpider.said = []
    handler = Said(logging.WARNING)
    logger = logging.getLogger("scrapy_ha.store.single_set")
    logger.addHandler(handler)
    return handler, logger


@pytest.mark.parametrize("kind", KINDS, ids=["bloom", "time-slices"])
@deferred_f_from_coro_f
async def test_a_running_worker_says_a_single_set_joined(
    redis_url: str, redis_client: Any, site: Any, kind: dict[str, Any]
) -> None:
    JoinedSpider.redis_client = redis_client
    handler, logger = _said()
    try:
        crawler = get_crawler(JoinedSpider, {**BASE, **kind, "REDIS_URL": redis_url})
        await crawler.crawl_async(base_url=site.url)
    finally:
        logger.removeHandler(handler)
    assert not redis_client.exists(KEYS.buckets)
    assert len([text for text in JoinedSpider.said if SAID in text]) == 1  # said once
    assert len(crawler.spider.items) == 50


@deferred_f_from_coro_f
async def test_a_bloom_crawl_with_a_single_set_beside_takes_a_bloom_worker(
    redis_url: str, redis_client: Any, site: Any
) -> None:
    settings = {**BASE, "HA_DUPEFILTER": "bloom", "REDIS_URL": redis_url}
    first = get_crawler(CatalogueSpider, settings)
    await first.crawl_async(base_url=site.url)
    assert redis_client.exists(KEYS.bloom)
    redis_client.sadd(KEYS.dupefilter, b"\x01" * 12)  # what the earlier worker writes
    handler, logger = _said()
    try:
        second = get_crawler(CatalogueSpider, settings)
        await second.crawl_async(base_url=site.url)
    finally:
        logger.removeHandler(handler)
    assert second.stats.get_value("finish_reason") == "finished"
    # said at its start, and once more if a round's check runs before the crawl ends (a
    # slow machine: a full suite's run said it twice)
    assert 1 <= len([text for text in JoinedSpider.said if SAID in text]) <= 2
    # the crawl's kind is the Bloom filter: a worker of the exact set is still refused
    third = get_crawler(CatalogueSpider, {**settings, "HA_DUPEFILTER": "set"})
    await third.crawl_async(base_url=site.url)
    assert third.stats.get_value("finish_reason") == "ha_start_failed"
