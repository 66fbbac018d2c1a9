"""A home page that yields three named paginated tasks (``a``: list pages 1-3, ``b``: 4-6,
``c``: 7-9) as the example project's does, then, with ``-a hold=1``, holds its own lease
for an hour (a worker killed meanwhile leaves it to be redone); items go to ITEMS_FILE as
in ``paged_spider.py``.

Run with ``scrapy runspider tests/roots_spider.py -a base_url=... -s ITEMS_FILE=...``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import scrapy

from tests.paged_spider import AppendPipeline
from tests.tasks_spider import TASKS, TasksSpider

__all__ = ["AppendPipeline", "RootsSpider"]


class RootsSpider(TasksSpider):
    def __init__(self, base_url: str = "", hold: str = "", **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self.hold = bool(hold)

    async def start(self) -> Any:
        yield scrapy.Request(f"{self.base_url}/", self.home, meta={"ha_task": False})

    async def home(self, response: Any) -> Any:
        for name, first in TASKS.items():
            yield scrapy.Request(f"{self.base_url}/list/{first}", meta={"ha_task": name})
        if self.hold:
            await asyncio.sleep(3600)
