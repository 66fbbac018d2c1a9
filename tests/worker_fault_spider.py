"""A spider whose callback for one page harms its own worker, for `scrapy runspider` in the
tests of what a worker's death or stall costs:

- ``FAULT=kill``: the callback SIGKILLs the worker at once (a crash in a C parser, the
  kernel's OOM killer): the poison tests;
- ``FAULT=block``: the callback blocks the event loop for ``BLOCK_SECONDS`` (a synchronous
  database call, a CPU-bound parse), and on until the file ``BLOCK_UNTIL`` exists if that is
  set, after writing ``BLOCK_MARKER``: the lease-keeper tests.

Run it as ``scrapy runspider tests/worker_fault_spider.py -a name=NAME -a base_url=URL -s
FAULT=kill -s FAULT_PATH=/item/3 -s ITEMS_FILE=items.jl`` (the name picks the crawl's keys).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import scrapy

#: Seconds a blocked callback waits at most for BLOCK_UNTIL (a test that died never writes it).
BLOCK_UNTIL_LIMIT = 120


class WorkerFaultSpider(scrapy.Spider):
    """Crawls the catalogue; the callback of FAULT_PATH kills or blocks the worker (FAULT)."""

    name = "worker_fault"

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
        if response.url.endswith(self.settings.get("FAULT_PATH")):
            self._fault(self.settings.get("FAULT"))
        item = {"id": int(response.css("span.id::text").get())}
        with open(self.settings.get("ITEMS_FILE"), "a") as out:
            out.write(json.dumps(item) + "\n")
        yield item

    def _fault(self, fault: str) -> None:
        if fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)  # within milliseconds of the hand-out
        elif fault == "block":
            Path(self.settings.get("BLOCK_MARKER")).write_text("blocking")
            time.sleep(self.settings.getfloat("BLOCK_SECONDS"))  # blocks the event loop
            until = self.settings.get("BLOCK_UNTIL")  # and, if set, until the test says so
            deadline = time.monotonic() + BLOCK_UNTIL_LIMIT
            while until and not Path(until).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        else:
            raise ValueError(f"FAULT={fault!r} must be 'kill' or 'block'")
