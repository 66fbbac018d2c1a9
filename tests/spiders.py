"""Spiders used by the in-process crawl tests."""

from __future__ import annotations

from typing import Any

import scrapy
from scrapy.exceptions import IgnoreRequest

from scrapy_ha.retry import PermanentError
from scrapy_ha.spiders import RedisSpider


class CatalogueSpider(scrapy.Spider):
    """List pages -> detail pages -> items, as in the example project."""

    name = "catalogue"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/list/1"]
        self.items: list[dict[str, Any]] = []

    def parse(self, response: Any) -> Any:
        for href in response.css("a.item::attr(href)").getall():
            yield response.follow(href, callback=self.parse_item)
        next_page = response.css("a.next::attr(href)").get()
        if next_page:
            yield response.follow(next_page, callback=self.parse)

    def parse_item(self, response: Any) -> Any:
        item = {"id": int(response.css("span.id::text").get())}
        self.items.append(item)
        yield item


class PathsSpider(scrapy.Spider):
    """Requests one path per outcome: success, 404, 500 with retries, redirect,
    offsite, callback error, dropped by a middleware, errback."""

    name = "paths"
    allowed_domains = ["127.0.0.1"]
    custom_settings = {
        "DOWNLOADER_MIDDLEWARES": {"tests.spiders.DropMiddleware": 500},
        "RETRY_TIMES": 1,
    }

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base_url = base_url
        self.outcomes: list[str] = []

    async def start(self) -> Any:
        for path in (
            "/item/1",
            "/status/404",
            "/status/500",
            "/redirect/2",
            "/item/3?boom",
            "/item/4?drop",
        ):
            yield scrapy.Request(self.base_url + path, errback=self.on_error)
        yield scrapy.Request("http://offsite.invalid/x")

    def parse(self, response: Any) -> Any:
        if "boom" in response.url:
            raise ValueError("the parser broke")
        self.outcomes.append(f"ok {response.url}")
        yield {"url": response.url}

    def on_error(self, failure: Any) -> None:
        self.outcomes.append(f"error {failure.request.url}")


class DropMiddleware:
    def process_request(self, request: Any) -> None:
        if request.url.endswith("?drop"):
            raise IgnoreRequest("dropped by a middleware")


class FedSpider(RedisSpider):
    """Reads start URLs from Redis (scrapy-redis's convention)."""

    name = "fed"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seen: list[str] = []

    def parse(self, response: Any) -> Any:
        self.seen.append(f"{response.request.method} {response.url} {response.meta.get('tag')}")
        yield {"url": response.url}


class FaultSpider(scrapy.Spider):
    """Fetches the given paths; the parser needs a span.id (a broken page raises)."""

    name = "faults"

    def __init__(self, base_url: str = "", paths: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base_url = base_url
        self.paths = paths
        self.ok: list[str] = []
        self.errors: list[str] = []

    async def start(self) -> Any:
        for i, path in enumerate(self.paths):
            yield scrapy.Request(
                self.base_url + path, errback=self.on_error, priority=len(self.paths) - i
            )

    def parse(self, response: Any) -> Any:
        if "permanent" in response.url:
            raise PermanentError("this page can never be read")
        item_id = int(response.css("span.id::text").get())  # TypeError on a broken page
        self.ok.append(response.url.replace(self.base_url, ""))
        yield {"id": item_id}

    def on_error(self, failure: Any) -> None:
        self.errors.append(failure.request.url.replace(self.base_url, ""))


class ListItemsSpider(scrapy.Spider):
    """The catalogue's list pages yield their items themselves (several items per page):
    ``{"id": n}`` for each item linked, then the next list page."""

    name = "list_items"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/list/1"]

    def parse(self, response: Any) -> Any:
        for href in response.css("a.item::attr(href)").getall():
            yield {"id": int(href.rstrip("/").rsplit("/", 1)[-1])}
        yield from response.follow_all(css="a.next", callback=self.parse)
