"""Spiders whose requests carry datetimes: one set by a downloader middleware, one fan-out."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import scrapy

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

FANOUT = 250


class SentAtSpider(scrapy.Spider):
    """``SentAtMiddleware`` stamps ``meta["sent_at"]``; one page fails once (a retry)."""

    name = "sent_at"
    base = ""

    async def start(self) -> AsyncIterator[Any]:
        yield scrapy.Request(f"{self.base}/products?page=1", meta={"want_sent_at": True})

    def parse(self, response: Any) -> Any:
        assert isinstance(response.meta["sent_at"], datetime)
        for href in response.css("li.product a::attr(href)").getall()[:4]:
            yield response.follow(href, callback=self.parse_detail, meta={"want_sent_at": True})
        page = response.url.rsplit("=", 1)[1]
        yield response.follow(
            f"/flaky/{page}", callback=self.parse_detail, meta={"want_sent_at": True}
        )
        if response.css("a.next") and "page=3" not in response.url:
            yield response.follow(
                response.css("a.next::attr(href)").get(), meta={"want_sent_at": True}
            )

    def parse_detail(self, response: Any) -> Any:
        assert isinstance(response.meta["sent_at"], datetime)
        yield {"key": response.url.rsplit("/", 2)[-2] + ":" + response.url.rsplit("/", 1)[1]}


class FanoutSpider(scrapy.Spider):
    """One callback yields 250 requests, each with a datetime in meta."""

    name = "fanout"
    base = ""
    #: The detail pages may be fetched in parallel (the site is ours, on loopback).
    custom_settings = {"CONCURRENT_REQUESTS_PER_DOMAIN": 8}

    async def start(self) -> AsyncIterator[Any]:
        yield scrapy.Request(f"{self.base}/products?page=1")

    def parse(self, response: Any) -> Any:
        now = datetime.now()
        for n in range(1, FANOUT + 1):
            url = f"{self.base}/product/{(n - 1) % 60 + 1}?v={n}"
            yield scrapy.Request(url, callback=self.parse_detail, meta={"queued_at": now, "n": n})

    def parse_detail(self, response: Any) -> Any:
        assert isinstance(response.meta["queued_at"], datetime)
        yield {"key": f"fanout:{response.meta['n']}"}
