"""The chaos spider: the demo catalogue (/ -> chains -> list pages -> items), plus a poison
page that kills its worker (CHAOS_POISON_ID) and a callback slower than a lease
(CHAOS_SLOW_ID, CHAOS_SLOW_SECONDS). Items are appended unbuffered to ITEMS_FILE."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import scrapy


class ChaosSpider(scrapy.Spider):
    name = "chaos"
    # the example project's unbuffered JSON-lines sink (example_project is on the path)
    custom_settings = {"ITEM_PIPELINES": {"catalogue.pipelines.AppendJsonLinesPipeline": 100}}

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/"]

    def parse(self, response: Any) -> Any:
        for href in response.css("a.item::attr(href)").getall():
            yield response.follow(href, callback=self.parse_item)
        for href in response.css("a.next::attr(href)").getall():
            yield response.follow(href, callback=self.parse)

    async def parse_item(self, response: Any) -> Any:
        item_id = int(response.css("span.id::text").get())
        if item_id == self.settings.getint("CHAOS_POISON_ID"):
            os._exit(70)  # this page kills whichever worker processes it
        if item_id == self.settings.getint("CHAOS_SLOW_ID"):
            await asyncio.sleep(self.settings.getfloat("CHAOS_SLOW_SECONDS"))
        yield {"id": item_id}
