"""Three paginated tasks, ``a`` (list pages 1-3), ``b`` (4-6) and ``c`` (7-9), each its own
start request, on the demo catalogue; items go to ITEMS_FILE as in ``paged_spider.py``.

Run with ``scrapy runspider tests/tasks_spider.py -a base_url=... -s ITEMS_FILE=...``.
"""

from __future__ import annotations

from typing import Any

import scrapy

from tests.paged_spider import AppendPipeline

__all__ = ["AppendPipeline", "TasksSpider"]

#: task -> its first list page (each task is three pages)
TASKS = {"a": 1, "b": 4, "c": 7}


class TasksSpider(scrapy.Spider):
    name = "paged"
    custom_settings = {"ITEM_PIPELINES": {"tests.paged_spider.AppendPipeline": 100}}

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base_url = base_url

    async def start(self) -> Any:
        for name, first in TASKS.items():
            yield scrapy.Request(f"{self.base_url}/list/{first}", meta={"ha_task": name})

    def parse(self, response: Any) -> Any:
        for href in response.css("a.item::attr(href)").getall():
            yield {"id": int(href.rsplit("/", 1)[1])}
        if not response.url.endswith(("/list/3", "/list/6", "/list/9")):
            next_page = response.css("a.next::attr(href)").get()
            if next_page:
                yield response.follow(next_page, callback=self.parse)
