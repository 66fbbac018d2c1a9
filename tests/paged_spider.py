"""A paginated task whose list pages carry the items (deterministic page output).

Run with ``scrapy runspider tests/paged_spider.py -a base_url=... -s ITEMS_FILE=...``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import scrapy


class AppendPipeline:
    """Each item is one unbuffered append: what reached the pipeline survives SIGKILL."""

    def __init__(
        self,
        path: str,
        stall_from: int,
        fail_once: int = 0,
        fail_always: int = 0,
        block_s: float = 0.0,
    ) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.stall_from = stall_from
        self.block_s = block_s  # each item blocks the event loop (a synchronous database client)
        self.fail_once = fail_once  # this item fails the first time (a database that is down)
        self.fail_always = fail_always  # and this one every time

    @classmethod
    def from_crawler(cls, crawler: Any) -> AppendPipeline:
        settings = crawler.settings
        return cls(
            settings["ITEMS_FILE"],
            settings.getint("STALL_ITEMS_FROM"),
            settings.getint("FAIL_ITEM_ONCE"),
            settings.getint("FAIL_ITEM_ALWAYS"),
            settings.getfloat("BLOCK_ITEM_S"),
        )

    async def process_item(self, item: Any) -> Any:
        if self.stall_from and item["id"] >= self.stall_from:
            await asyncio.sleep(3600)  # a pipeline stuck on these items (the test kills it)
        if self.fail_once and item["id"] == self.fail_once:
            self.fail_once = 0
            raise ConnectionError("the database is down")
        if self.fail_always and item["id"] == self.fail_always:
            raise ValueError("the database refuses this item")
        if self.block_s:
            time.sleep(self.block_s)
        os.write(self.fd, (json.dumps(dict(item)) + "\n").encode())
        return item

    def close_spider(self, spider: Any = None) -> None:
        os.close(self.fd)


class PagedSpider(scrapy.Spider):
    name = "paged"
    custom_settings = {"ITEM_PIPELINES": {__name__ + ".AppendPipeline": 100}}

    def __init__(self, base_url: str = "", join: str = "", plain: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # join=1: a worker that only takes part in the crawl already in Redis
        self.start_urls = [] if join else [base_url + "/list/1"]
        self.plain = bool(plain)  # plain=1: a start request filtered as any (not dont_filter)

    async def start(self) -> Any:
        for url in self.start_urls:
            yield scrapy.Request(url, dont_filter=not self.plain)

    def parse(self, response: Any) -> Any:
        fields = response.meta.get("ha_checkpoint", {})
        fields["pages_seen"] = fields.get("pages_seen", 0) + 1
        if response.url.endswith(self.settings.get("BAD_FIELDS_AT") or "-"):
            fields["title"] = "caf\ud83d"  # half an emoji: Python encodes it, Redis refuses it
            fields["seen"] = {1, 2}  # not JSON
            fields["deep"] = deep = []  # nested deeper than Redis's cjson reads
            for _ in range(1000):
                deep.append([])
                deep = deep[0]
        if response.url.endswith(self.settings.get("RAW_BAD_CHECKPOINT_AT") or "-"):
            # a checkpoint saved by hand that Redis's cjson refuses (a lone surrogate)
            from scrapy_ha.middlewares.registry import scheduler_for  # noqa: PLC0415

            scheduler = scheduler_for(self.crawler)
            assert scheduler is not None
            bad = b'{"task":"raw","page":2,"title":"caf\\ud83d"}'
            scheduler.save_checkpoint(response.request, "raw", bad, 60_000, at_finish=False)
        for href in response.css("a.item::attr(href)").getall():
            yield {"id": int(href.rsplit("/", 1)[1])}
        next_page = response.css("a.next::attr(href)").get()
        if next_page:
            yield response.follow(next_page, callback=self.parse)
        if response.url.endswith(self.settings.get("RAISE_AFTER_NEXT") or "-"):
            raise ValueError(f"parse error after yielding the next page of {response.url}")
