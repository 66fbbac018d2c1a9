"""A paginated catalogue: list pages -> detail pages -> items."""

from __future__ import annotations

from typing import Any

import scrapy


class CatalogueSpider(scrapy.Spider):
    """Crawl the demo site: ``scrapy crawl catalogue -a base_url=http://127.0.0.1:PORT``."""

    name = "catalogue"

    def __init__(self, base_url: str = "http://127.0.0.1:8000", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [base_url.rstrip("/") + "/"]

    def parse(self, response: scrapy.http.Response) -> Any:
        for href in response.css("a.item::attr(href)").getall():
            yield response.follow(href, callback=self.parse_item)
        for next_page in response.css("a.next::attr(href)").getall():
            yield response.follow(next_page, callback=self.parse)

    def parse_item(self, response: scrapy.http.Response) -> Any:
        yield {
            "id": int(response.css("span.id::text").get()),
            "name": response.css("h1.name::text").get(),
            "price": response.css("span.price::text").get(),
            "url": response.url,
        }
