"""A paginated catalogue: / -> pagination chains of list pages -> detail pages -> items."""

from __future__ import annotations

from typing import Any

import scrapy


class CatalogueSpider(scrapy.Spider):
    """Crawl the demo site: ``scrapy crawl catalogue -a base_url=http://127.0.0.1:PORT``.

    Each pagination chain is a task (``meta["ha_task"]``): with ``HA_CHECKPOINTS`` on, a chain
    started again resumes from its checkpointed page.
    """

    name = "catalogue"

    def __init__(self, base_url: str = "http://127.0.0.1:8000", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base_url = base_url.rstrip("/")

    async def start(self) -> Any:
        # the home page only lists the chains: it is not a task itself
        yield scrapy.Request(
            self.base_url + "/", callback=self.parse_home, meta={"ha_task": False}, dont_filter=True
        )

    def parse_home(self, response: scrapy.http.Response) -> Any:
        for href in response.css("a.next::attr(href)").getall():
            yield response.follow(href, callback=self.parse, meta={"ha_task": f"chain{href}"})

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
