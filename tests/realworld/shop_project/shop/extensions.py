"""Test plumbing, not part of the everyday project: holds a crawl at its start until every
worker of it has joined, so that two workers started at once run ONE crawl (on a loaded
machine the second could otherwise start after the first finished and cleared the crawl,
and run it again: what a finished crawl rightly does)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import redis.asyncio
from scrapy import Spider, signals
from scrapy.exceptions import NotConfigured

from scrapy_ha.keys import Keys

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

#: Seconds to wait for the other workers before giving up (with an ERROR the test sees).
JOIN_TIMEOUT = 60.0


class WaitForWorkers:
    """With ``SHOP_WAIT_WORKERS=N``: no start request before N workers are alive in Redis."""

    def __init__(self, crawler: Crawler) -> None:
        self.wanted = crawler.settings.getint("SHOP_WAIT_WORKERS")
        if self.wanted < 2:
            raise NotConfigured
        self.url = crawler.settings["REDIS_URL"]
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Any:
        return cls(crawler)

    async def spider_opened(self, spider: Spider) -> None:
        client = redis.asyncio.Redis.from_url(self.url)
        key = Keys("ha", spider.name).workers
        deadline = time.monotonic() + JOIN_TIMEOUT
        try:
            while await client.zcard(key) < self.wanted:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.wanted} workers did not join {key} in time")
                await asyncio.sleep(0.1)
        finally:
            await client.aclose()
        spider.logger.info("All %d workers joined the crawl", self.wanted)
