"""A page whose children carry large meta is stored in calls of bounded size.

Redis runs a script call whole, and every client of the crawl (the other workers, the
dashboard, the CLI) waits meanwhile. The children were sent 500 a call whatever their size:
in a QA run 300 children of 1 MB of meta each went in one call that held Redis for 4.9 s
(a PING from another client waited 8.2 s), and 500 children of 2 MB would pass the 1 GB a
Redis client may send at once. Real redis-server, real crawl."""

from __future__ import annotations

import base64
import os
from typing import Any

import pytest
import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.scheduler.outbox import BATCH_BYTES
from scrapy_ha.store.queue import RedisQueue

#: children of the page, and the meta each carries (random: compaction cannot shrink it much)
CHILDREN = 24
META_BYTES = 1 << 20

pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


class HeavyChildrenSpider(scrapy.Spider):
    name = "heavy_children"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/list/1"]
        self.base_url = base_url
        self.done: list[int] = []

    def parse(self, response: Any) -> Any:
        for i in range(1, CHILDREN + 1):
            blob = base64.b64encode(os.urandom(META_BYTES * 3 // 4)).decode()
            yield scrapy.Request(
                f"{self.base_url}/item/{i}", meta={"blob": blob}, callback=self.child
            )

    def child(self, response: Any) -> None:
        self.done.append(int(response.url.rsplit("/", 1)[1]))


@deferred_f_from_coro_f
async def test_children_of_large_meta_go_to_redis_in_calls_of_bounded_size(
    redis_url, site, monkeypatch
):
    sent: list[tuple[int, int]] = []  # (children, payload bytes) of each call that stores some
    sync = RedisQueue.sync

    async def recorded(self: RedisQueue, *args: Any, **kwargs: Any) -> Any:
        enqueue = kwargs.get("enqueue") or []
        if enqueue:
            sent.append((len(enqueue), sum(len(e.payload) for e in enqueue)))
        return await sync(self, *args, **kwargs)

    monkeypatch.setattr(RedisQueue, "sync", recorded)
    settings = {
        "SCHEDULER": "scrapy_ha.Scheduler",
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.5,
        "HA_EARLY_DOWNLOAD": False,  # every child goes to Redis first
        "CONCURRENT_REQUESTS": 4,
        "LOG_LEVEL": "INFO",
    }
    crawler = get_crawler(HeavyChildrenSpider, settings)
    await crawler.crawl_async(base_url=site.url)
    assert sorted(crawler.spider.done) == list(range(1, CHILDREN + 1))
    stored = sum(n for n, _ in sent)
    assert stored >= CHILDREN
    assert max(size for _, size in sent) <= BATCH_BYTES, sent
    assert crawler.stats.get_value("finish_reason") == "finished"
