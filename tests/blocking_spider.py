"""A spider whose callback blocks the event loop (a synchronous database call, a CPU-bound
parse), for `scrapy runspider` in the lease-keeper tests."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import scrapy


class BlockingSpider(scrapy.Spider):
    """Crawls the catalogue; the callback of BLOCK_PATH blocks for BLOCK_SECONDS."""

    name = "blocking"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/list/1"]

    def parse(self, response: Any) -> Any:
        for href in response.css("a.item::attr(href)").getall():
            yield response.follow(href, callback=self.parse_item)
        next_page = response.css("a.next::attr(href)").get()
        if next_page:
            yield response.follow(next_page, callback=self.parse)

    def parse_item(self, response: Any) -> Any:
        if response.url.endswith(self.settings.get("BLOCK_PATH")):
            Path(self.settings.get("BLOCK_MARKER")).write_text("blocking")
            time.sleep(self.settings.getfloat("BLOCK_SECONDS"))  # blocks the event loop
            until = self.settings.get("BLOCK_UNTIL")  # and, if set, until the test says so
            deadline = time.monotonic() + 120
            while until and not Path(until).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        item = {"id": int(response.css("span.id::text").get())}
        with open(self.settings.get("ITEMS_FILE"), "a") as out:
            out.write(json.dumps(item) + "\n")
        yield item
