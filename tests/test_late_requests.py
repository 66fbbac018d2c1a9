"""A request scheduled after the page it came from was finished and acked: it is stored and
crawled, never refused as the child of a lost lease.

Spiders pass data along with ``meta=response.meta``, which copies the page's lease into the
new request. Scheduled while the page is still in flight (yielded by its callback, or a
redirect of it), that lease rightly fences it; scheduled later (from a ``spider_idle``
handler, a second pass over links collected during the crawl), the lease is one this worker
already acked: Redis refused such a request as a zombie's child, and nobody would ever redo
the acked page, so it was lost."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import scrapy
from scrapy import signals
from scrapy.exceptions import DontCloseSpider
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.keys import Keys

#: Item pages the second pass visits.
SECOND_PASS = (3, 7, 11)


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


class SecondPassSpider(scrapy.Spider):
    """Reads one list page, keeps requests for some of its items (``meta=response.meta``, as
    tutorials teach), and schedules them once the list page is acked and the crawl is idle."""

    name = "second_pass"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/list/1"]
        self.later: list[scrapy.Request] = []
        self.items: list[int] = []

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> Any:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.second_pass, signal=signals.spider_idle)
        return spider

    def parse(self, response: Any) -> Any:
        for n in SECOND_PASS:
            url = response.urljoin(f"/item/{n}")
            self.later.append(scrapy.Request(url, self.parse_item, meta=response.meta))
        yield {"list": response.url}

    def parse_item(self, response: Any) -> Any:
        self.items.append(int(response.css("span.id::text").get()))

    def second_pass(self) -> None:
        if not self.later:
            return
        if not self.crawler.stats.get_value("ha/acked"):
            raise DontCloseSpider  # the list page's ack first: that is the case under test
        for request in self.later:
            self.crawler.engine.crawl(request)
        self.later.clear()
        raise DontCloseSpider


@deferred_f_from_coro_f
async def test_a_request_scheduled_after_its_page_was_acked_is_crawled(
    redis_url, redis_client, site
):
    crawler = get_crawler(
        SecondPassSpider,
        {
            "ADDONS": {"scrapy_ha.Addon": 0},
            "REDIS_URL": redis_url,
            "HA_IDLE_TIMEOUT": 0.3,
            "LOG_LEVEL": "INFO",
        },
    )
    crawling = asyncio.ensure_future(crawler.crawl_async(base_url=site.url))
    deadline = time.monotonic() + 60
    while not crawling.done():
        assert time.monotonic() < deadline, "the crawl did not finish in 60 s"
        await asyncio.sleep(0.05)
    await crawling
    assert sorted(crawler.spider.items) == list(SECOND_PASS)
    assert crawler.stats.get_value("ha/children_refused") is None
    keys = Keys("ha", "second_pass")
    assert redis_client.zcard(keys.dead) == 0
