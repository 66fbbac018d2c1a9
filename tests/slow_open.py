"""A Scrapy extension whose ``spider_opened`` handler holds the spider's open until the
file named by ``SLOW_OPEN_FILE`` exists (a slow pipeline, a handler that logs in
somewhere): the window between the scheduler's open and the engine's start."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from scrapy import signals

if TYPE_CHECKING:
    from typing import Self

    from scrapy.crawler import Crawler

logger = logging.getLogger(__name__)

#: Seconds the handler holds the open at most (a test that never creates the file).
HOLD_AT_MOST = 60.0


class SlowOpen:
    def __init__(self, release: Path) -> None:
        self.release = release

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        extension = cls(Path(crawler.settings["SLOW_OPEN_FILE"]))
        crawler.signals.connect(extension.opened, signal=signals.spider_opened)
        return extension

    async def opened(self) -> None:
        logger.warning("slow open: holding the spider's open")
        loop = asyncio.get_running_loop()
        until = loop.time() + HOLD_AT_MOST
        while not self.release.exists() and loop.time() < until:
            await asyncio.sleep(0.02)
        logger.warning("slow open: released")
