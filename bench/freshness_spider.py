"""The freshness benchmark's spider: the site's index, then every page, each revisited
(``HA_REVISIT`` comes from the command line); it counts the pages its callback saw."""

from __future__ import annotations

from typing import Any

import scrapy


class FreshnessSpider(scrapy.Spider):
    name = "freshness"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/"]

    def parse(self, response: Any) -> Any:
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse_page)

    def parse_page(self, response: Any) -> Any:
        yield {"url": response.url, "version": response.css("p::text").get()}
