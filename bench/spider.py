"""The benchmark spider: / -> list pages -> detail pages; records the time of its first and
last response and writes {"pages", "seconds", "memusage"} to the BENCH_OUT file at close."""

from __future__ import annotations

import json
import time
from typing import Any

import scrapy


class BenchSpider(scrapy.Spider):
    name = "bench"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/"]
        self.first = self.last = 0.0
        self.pages = 0

    def _seen(self) -> None:
        now = time.perf_counter()
        self.first = self.first or now
        self.last = now
        self.pages += 1

    def parse(self, response: Any) -> Any:
        self._seen()
        for href in response.css("a.item::attr(href)").getall():
            yield response.follow(href, callback=self.parse_item)
        for href in response.css("a.next::attr(href)").getall():
            yield response.follow(href, callback=self.parse)

    def parse_item(self, response: Any) -> Any:
        self._seen()
        yield {"id": response.css("span.id::text").get()}

    def closed(self, reason: str) -> None:
        out = self.settings.get("BENCH_OUT")
        if out:
            stats = self.crawler.stats
            with open(out, "w") as f:
                json.dump(
                    {
                        "pages": self.pages,
                        "seconds": self.last - self.first,
                        "memusage": stats.get_value("memusage/max"),
                        "reason": reason,
                    },
                    f,
                )
