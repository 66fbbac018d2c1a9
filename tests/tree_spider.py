"""A task that branches: the demo site's ``/`` links to the first page of each of its
``--chains`` chains, and ``parse`` follows every ``a.next`` (the reference's
``follow_all(css="a.next", callback=self.parse)``); items go to ITEMS_FILE.

Run with ``scrapy runspider tests/tree_spider.py -a base_url=... -s ITEMS_FILE=...``.
"""

from __future__ import annotations

from typing import Any

import scrapy

from tests.paged_spider import AppendPipeline

__all__ = ["AppendPipeline", "TreeSpider"]


class TreeSpider(scrapy.Spider):
    name = "paged"
    custom_settings = {"ITEM_PIPELINES": {"tests.paged_spider.AppendPipeline": 100}}

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/"]

    def parse(self, response: Any) -> Any:
        for href in response.css("a.item::attr(href)").getall():
            yield {"id": int(href.rsplit("/", 1)[1])}
        yield from response.follow_all(css="a.next", callback=self.parse)
