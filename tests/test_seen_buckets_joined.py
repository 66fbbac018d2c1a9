"""A worker of a version before the buckets that joins a crawl in buckets after the workers
of this version started writes the single set ``dupefilter``: the two versions do not see
each other's URLs. A running worker says so (once), not only one that starts later."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from scrapy import signals
from scrapy.exceptions import DontCloseSpider
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.keys import Keys
from tests.spiders import CatalogueSpider

pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")

KEYS = Keys("ha", "catalogue")
#: Seconds the spider keeps the crawl open at most for the WARNING.
HOLD = 30.0
SAID = "and a single set (ha:{catalogue}:dupefilter) too"


class JoinedSpider(CatalogueSpider):
    """Writes the older worker's single set at its first response; keeps the crawl open
    until the WARNING was logged (at most :data:`HOLD` seconds of idleness)."""

    name = "catalogue"
    redis_client: Any = None
    said: list[str] = []

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> JoinedSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.on_response, signal=signals.response_received)
        crawler.signals.connect(spider.on_idle, signal=signals.spider_idle)
        spider.joined = False
        spider.idle_since: float | None = None
        return spider

    def on_response(self, response: Any, request: Any, spider: Any) -> None:
        if not self.joined:
            self.joined = True
            self.redis_client.sadd(KEYS.dupefilter, b"\x01" * 12)  # what the older one writes

    def on_idle(self, spider: Any) -> None:
        if any(SAID in text for text in self.said):
            return
        self.idle_since = self.idle_since or time.monotonic()
        if time.monotonic() - self.idle_since < HOLD:
            raise DontCloseSpider


class Said(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        JoinedSpider.said.append(record.getMessage())


@deferred_f_from_coro_f
async def test_a_running_worker_says_a_single_set_joined_its_buckets(redis_url, redis_client, site):
    JoinedSpider.redis_client = redis_client
    JoinedSpider.said = []
    handler = Said(logging.WARNING)
    logger = logging.getLogger("scrapy_ha.store.single_set")
    logger.addHandler(handler)
    settings = {
        "SCHEDULER": "scrapy_ha.Scheduler",
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.3,
        "HA_RECLAIM_INTERVAL": 0.5,
        "SCHEDULER_PERSIST": True,
        "LOG_LEVEL": "INFO",
    }
    try:
        crawler = get_crawler(JoinedSpider, settings)
        await crawler.crawl_async(base_url=site.url)
    finally:
        logger.removeHandler(handler)
    assert redis_client.exists(KEYS.buckets)  # the crawl was made in buckets, at its start
    assert len([text for text in JoinedSpider.said if SAID in text]) == 1  # said once
    assert len(crawler.spider.items) == 50
