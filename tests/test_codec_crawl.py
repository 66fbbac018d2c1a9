"""A crawl whose requests carry an Item in meta, a dataclass in cb_kwargs and a download
slot of their own, through ``scrapy_ha.Scheduler`` and a real Redis: every item arrives, with
its types, and the slot's settings apply."""

from __future__ import annotations

import dataclasses
import datetime
from decimal import Decimal
from typing import Any

import pytest
import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler


class ListingItem(scrapy.Item):
    list_page = scrapy.Field()
    seen = scrapy.Field()
    id = scrapy.Field()


@dataclasses.dataclass
class Context:
    position: int
    price: Decimal
    tags: frozenset[str]


class ItemInMetaSpider(scrapy.Spider):
    """The idiom of Scrapy's docs: a half-filled item travels to the detail page in meta."""

    name = "item_in_meta"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/list/1"]
        self.items: list[dict[str, Any]] = []
        self.slots: list[tuple[str, int]] = []

    def parse(self, response: Any) -> Any:
        for position, href in enumerate(response.css("a.item::attr(href)").getall()):
            item = ListingItem(list_page=response.url, seen=datetime.datetime(2026, 1, 1, 12))
            context = Context(position, Decimal("9.99"), frozenset({"new"}))
            yield response.follow(
                href,
                callback=self.parse_item,
                meta={"item": item, "download_slot": "details"},
                cb_kwargs={"context": context},
            )
        next_page = response.css("a.next::attr(href)").get()
        if next_page:
            yield response.follow(next_page, callback=self.parse)

    def parse_item(self, response: Any, context: Context) -> Any:
        item = response.meta["item"]
        assert type(item) is ListingItem and type(context) is Context
        assert type(item["seen"]) is datetime.datetime and type(context.price) is Decimal
        assert context.tags == frozenset({"new"})
        # the slot the spider chose, with its DOWNLOAD_SLOTS settings, applied after the queue
        slot = self.crawler.engine.downloader.slots[response.meta["download_slot"]]
        self.slots.append((response.meta["download_slot"], slot.concurrency))
        item["id"] = int(response.css("span.id::text").get())
        self.items.append(dict(item))
        yield item


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


@deferred_f_from_coro_f
async def test_items_in_meta_and_dataclasses_in_cb_kwargs_survive_the_queue(redis_url, site):
    crawler = get_crawler(
        ItemInMetaSpider,
        {
            "SCHEDULER": "scrapy_ha.Scheduler",
            "REDIS_URL": redis_url,
            "HA_IDLE_TIMEOUT": 0.3,
            "LOG_LEVEL": "INFO",
            "DOWNLOAD_SLOTS": {"details": {"concurrency": 3}},
        },
    )
    await crawler.crawl_async(base_url=site.url)
    items = crawler.spider.items
    assert sorted(i["id"] for i in items) == list(range(1, 51))
    assert all(i["list_page"].startswith(site.url + "/list/") for i in items)
    assert set(crawler.spider.slots) == {("details", 3)}
    stats = crawler.stats.get_stats()
    assert stats["finish_reason"] == "finished"
    assert stats.get("spider_exceptions/AssertionError") is None
    assert stats["item_scraped_count"] == 50
