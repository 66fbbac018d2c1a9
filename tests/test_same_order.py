"""A spider moved from Scrapy's scheduler to scrapy-ha downloads the same requests in the same
order on one worker: the same spider crawled twice, once with each scheduler, one request at a
time, its download order compared whole (in-process crawls, a real Redis, the demo site)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

SCRAPY = "scrapy.core.scheduler.Scheduler"
#: Seconds a download takes (the site's delay).
DOWNLOAD_TIME = "0.1"
#: Seconds a callback waits at most for the engine to pick the request after its page: with
#: nothing left to pick, it yields after this.
NEXT_PICK_WAIT = 1.0


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


class MixedPrioritySpider(scrapy.Spider):
    """Two start pages; each list page yields its items at priorities -1, 0 and 1 in turn
    and its next page at 0, and every third item a second look at priority 2 (dont_filter):
    depth-first and breadth, ties within a priority, start requests among callback ones.

    A callback yields only once the engine has picked the request after its page (or there
    was none to pick), whichever scheduler runs: the engine picks the next request as a
    download ends, and that pick must not race the callback's new requests, or the order
    would be a race of the event loop in Scrapy itself (a busy machine loses such races)."""

    name = "mixed"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/list/1", base_url + "/list/3"]
        self.seen: list[str] = []
        self.picked = 0  # requests that reached the downloader

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> MixedPrioritySpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider._picked, signal=scrapy.signals.request_reached_downloader)
        crawler.signals.connect(spider._received, signal=scrapy.signals.response_received)
        return spider

    def _picked(self, request: Any, spider: Any) -> None:
        self.picked += 1

    def _received(self, response: Any, request: Any, spider: Any) -> None:
        request.meta["picked_before"] = self.picked

    async def _after_next_pick(self, response: Any) -> None:
        before = response.meta.get("picked_before", self.picked)
        deadline = asyncio.get_running_loop().time() + NEXT_PICK_WAIT
        while self.picked <= before and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.005)

    async def parse(self, response: Any) -> Any:
        await self._after_next_pick(response)
        self.seen.append(response.url)
        for i, href in enumerate(response.css("a.item::attr(href)").getall()):
            yield response.follow(href, callback=self.parse_item, priority=i % 3 - 1)
        next_page = response.css("a.next::attr(href)").get()
        if next_page:
            yield response.follow(next_page, callback=self.parse)

    async def parse_item(self, response: Any) -> Any:
        await self._after_next_pick(response)
        self.seen.append(response.url)
        item_id = int(response.css("span.id::text").get())
        if item_id % 3 == 0 and "again" not in response.meta:
            yield response.request.replace(priority=2, dont_filter=True, meta={"again": 1})
        yield {"id": item_id}


def _settings(scheduler: str, redis_url: str, **extra: Any) -> dict[str, Any]:
    return {
        "SCHEDULER": scheduler,
        "REDIS_URL": redis_url,
        "CONCURRENT_REQUESTS": 1,  # one at a time: the download order is the queue's order
        "HA_IDLE_TIMEOUT": 0.3,
        "HA_MAX_INFLIGHT": 8,
        "LOG_LEVEL": "INFO",
        **extra,
    }


async def _orders(redis_url: str, site: Any, extra: dict[str, Any]) -> dict[str, list[str]]:
    orders = {}
    for scheduler in (SCRAPY, "scrapy_ha.Scheduler"):
        crawler = get_crawler(MixedPrioritySpider, _settings(scheduler, redis_url, **extra))
        await crawler.crawl_async(base_url=site.url)
        orders[scheduler] = [url.removeprefix(site.url) for url in crawler.spider.seen]

    assert len(orders[SCRAPY]) == 6 + 50 + 16  # pages (a start one twice), items, second looks
    return orders


def _slow_site(site_factory: Any) -> Any:
    return site_factory("--pages", "5", "--per-page", "10", "--delay", DOWNLOAD_TIME)


@deferred_f_from_coro_f
async def test_in_fifo_order_the_same_spider_downloads_in_the_same_order(redis_url, site_factory):
    fifo = {
        "SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue",
        "SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.ScrapyPriorityQueue",
    }
    orders = await _orders(redis_url, _slow_site(site_factory), fifo)
    assert orders["scrapy_ha.Scheduler"] == orders[SCRAPY]


@deferred_f_from_coro_f
async def test_with_scrapys_defaults_the_same_spider_downloads_in_the_same_order(
    redis_url, site_factory
):
    """LIFO and DownloaderAwarePriorityQueue: a worker keeps its new requests in its buffer
    (scrapy_ha.scheduler.keep), ahead of those it leased before them."""
    orders = await _orders(redis_url, _slow_site(site_factory), {})
    assert orders["scrapy_ha.Scheduler"] == orders[SCRAPY]


@deferred_f_from_coro_f
async def test_in_lifo_order_with_one_priority_queue_the_same_spider_downloads_the_same(
    redis_url, site_factory
):
    lifo = {"SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.ScrapyPriorityQueue"}
    orders = await _orders(redis_url, _slow_site(site_factory), lifo)
    assert orders["scrapy_ha.Scheduler"] == orders[SCRAPY]


class ManyStartsSpider(MixedPrioritySpider):
    """Every list page a start request: the worker leases the next start requests ahead
    while the first page's callback has yet to yield its items."""

    name = "many_starts"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self.start_urls = [f"{base_url}/list/{n}" for n in range(1, 6)]


@deferred_f_from_coro_f
async def test_in_fifo_order_a_callbacks_request_goes_before_a_start_request_leased_ahead(
    redis_url, site_factory
):
    """Scrapy's start queues: at equal priority a callback's request goes first. A start
    request the worker had leased ahead went before one Redis held (a QA crawl of four sites:
    the third start page was downloaded third, before the first page's links)."""
    fifo = {
        "SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue",
        "SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.ScrapyPriorityQueue",
    }
    site = _slow_site(site_factory)
    orders = {}
    for scheduler in (SCRAPY, "scrapy_ha.Scheduler"):
        crawler = get_crawler(ManyStartsSpider, _settings(scheduler, redis_url, **fifo))
        await crawler.crawl_async(base_url=site.url)
        orders[scheduler] = [url.removeprefix(site.url) for url in crawler.spider.seen]
    assert orders["scrapy_ha.Scheduler"] == orders[SCRAPY]
