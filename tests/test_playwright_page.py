"""A request whose attempt left a browser page in its meta (scrapy-playwright's
``playwright_include_page``) is retried from Redis, and the page is closed.

scrapy-playwright puts the attempt's Playwright page in ``meta["playwright_page"]`` as soon
as the download starts, and leaves it open for the callback or the errback. The page stands
in for one here (no browser in the test: a downloader middleware sets what the download
handler would): before, every retry of such a request failed to be stored (``CodecError``:
a page cannot be stored) and the request was dead-lettered as ``error`` after its first
503; and with the key merely left out, the page of each retried attempt stayed open, and
``PLAYWRIGHT_MAX_PAGES_PER_CONTEXT`` such pages made every later request wait for ever.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from tests.test_retry_crawl import FAST_RETRIES, dead_letters

pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


class Page:
    """What the spider and scrapy-ha see of a Playwright page."""

    made: list[Page] = []

    def __init__(self) -> None:
        self.closed = False
        Page.made.append(self)

    def is_closed(self) -> bool:
        return self.closed

    async def close(self) -> None:
        await asyncio.sleep(0)
        self.closed = True


class IncludePage:
    """A new page for each attempt, in meta, as scrapy-playwright's handler puts it."""

    def process_request(self, request: scrapy.Request, spider: Any = None) -> None:
        if request.meta.get("playwright_include_page"):
            request.meta["playwright_page"] = Page()


class PageSpider(scrapy.Spider):
    name = "pages"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base_url = base_url
        self.ok: list[str] = []

    async def start(self) -> Any:
        for path in ("/flaky/1?fail=2&status=503", "/flaky/2?fail=9&status=503"):
            meta = {"playwright": True, "playwright_include_page": True}
            yield scrapy.Request(self.base_url + path, meta=meta, errback=self.errback)

    async def parse(self, response: Any) -> Any:
        await response.meta["playwright_page"].close()
        self.ok.append(response.url.replace(self.base_url, ""))
        yield {"url": response.url}

    async def errback(self, failure: Any) -> None:
        await failure.request.meta["playwright_page"].close()


@deferred_f_from_coro_f
async def test_a_request_holding_its_page_is_retried_and_every_page_closed(
    redis_url, redis_client, site
):
    Page.made.clear()
    settings = {
        **FAST_RETRIES,
        "REDIS_URL": redis_url,
        "DOWNLOADER_MIDDLEWARES": {f"{__name__}.IncludePage": 1000},
    }
    crawler = get_crawler(PageSpider, settings)
    await crawler.crawl_async(base_url=site.url)
    assert crawler.spider.ok == ["/flaky/1?fail=2&status=503"]
    dead = dead_letters(redis_client, "pages")
    assert {p: d["class"] for p, d in dead.items()} == {"flaky/2?fail=9&status=503": "server"}
    assert crawler.stats.get_value("ha/retry/count") == 2 + 2
    assert crawler.stats.get_value("ha/dead/error") is None
    assert len(Page.made) == 3 + 3  # a page per attempt
    await asyncio.sleep(0.1)  # (closed in the background)
    assert all(page.closed for page in Page.made)
