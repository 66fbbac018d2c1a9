"""A spider whose callback for one page kills its own worker process at once (a crash in a
C parser, the kernel's OOM killer), for `scrapy runspider` in the poison tests."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import scrapy


class KillerSpider(scrapy.Spider):
    """Crawls the catalogue; the callback of KILL_PATH SIGKILLs the worker running it."""

    name = "killer"

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
        if response.url.endswith(self.settings.get("KILL_PATH")):
            os.kill(os.getpid(), signal.SIGKILL)  # within milliseconds of the hand-out
        item = {"id": int(response.css("span.id::text").get())}
        with open(self.settings.get("ITEMS_FILE"), "a") as out:
            out.write(json.dumps(item) + "\n")
        yield item
