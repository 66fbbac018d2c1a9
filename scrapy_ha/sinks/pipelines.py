"""The project's own item pipelines, run by a consumer of the item stream.

Each item is rebuilt with its class (an item class of the spider's package, or one listed in
``HA_CODEC_CLASSES``) and handed to the pipelines of ``HA_ITEMS_PIPELINES`` (else
``ITEM_PIPELINES``), one after the other, in the stream's order; a batch is acknowledged
once every item of it went through them (``DropItem`` counts as through). A pipeline that
raises leaves the batch pending: it is delivered again after a pause.

Exactly once, here, is the pipelines' part: an item is handed to them until they accept
it, so a consumer killed after a pipeline wrote an item and before the batch was
acknowledged hands it to them again. A pipeline that writes keys its write by
:func:`current_entry` (the entry's id, unique in the crawl: an upsert, or a unique key), and
then stores each item once.
"""

from __future__ import annotations

import contextvars
import logging
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import DropItem
from scrapy.pipelines import ItemPipelineManager
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.defer import maybe_deferred_to_future

from scrapy_ha.config.items import consumer_pipelines
from scrapy_ha.config.validate import ConfigError

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler

    from scrapy_ha.sinks.consumer import Entry

__all__ = ["PipelinesSink", "current_entry"]

logger = logging.getLogger(__name__)

_ENTRY: contextvars.ContextVar[str | None] = contextvars.ContextVar("ha_item_entry", default=None)


def current_entry() -> str | None:
    """The id of the stream entry the pipelines are processing (None outside a consumer):
    unique in the crawl, the key that makes a pipeline's write idempotent."""
    return _ENTRY.get()


def _has_stats(crawler: Crawler) -> bool:
    try:
        return crawler.stats is not None
    except RuntimeError:  # Scrapy 2.19: "Crawler.stats is not set yet"
        return False


class PipelinesSink:
    """Runs *crawler*'s consumer pipelines (see :func:`consumer_pipelines`) for *spider*."""

    shares = True  # the pipelines' idempotence (by current_entry()) holds for any consumer

    def __init__(self, crawler: Crawler, spider: Spider) -> None:
        self.crawler = crawler
        self.spider = spider
        settings = crawler.settings
        if not settings.frozen:
            settings.set("ITEM_PIPELINES", consumer_pipelines(settings), priority="cmdline")
        if not _has_stats(crawler):  # no crawl started: the pipelines may still count
            crawler.stats = MemoryStatsCollector(crawler)
        crawler.spider = spider
        try:
            self.manager = ItemPipelineManager.from_crawler(crawler)
        except Exception as exc:  # a path that does not import, a pipeline that will not start
            name = (
                "ITEM_PIPELINES"
                if settings.get("HA_ITEMS_PIPELINES") is None
                else ("HA_ITEMS_PIPELINES")
            )
            why = (str(exc).strip() or type(exc).__name__).splitlines()[0]
            raise ConfigError(
                f"{name}: a pipeline could not be made ({type(exc).__name__}: {why})"
            ) from exc
        self.dropped = 0

    async def open(self) -> list[str]:
        """Open the pipelines to write (not to declare, undeclare or list what is aside:
        review); none enabled is refused, as every item would be acknowledged into nothing."""
        if not self.manager.middlewares:
            raise ConfigError(
                "--to pipelines: no item pipeline is enabled (HA_ITEMS_PIPELINES, else "
                "ITEM_PIPELINES): name the pipelines that store the items"
            )
        await self._call("open_spider")
        return []

    async def write(self, entries: list[Entry]) -> int:
        """Hand each entry's item to the pipelines; return how many went through (not
        dropped)."""
        stored = 0
        for entry in entries:
            item = entry.item(self.spider)
            token = _ENTRY.set(entry.id)
            try:
                await self._process(item)
                stored += 1
            except DropItem as exc:
                self.dropped += 1
                logger.info("Item of stream entry %s dropped: %s", entry.id, exc)
            finally:
                _ENTRY.reset(token)
        return stored

    async def _process(self, item: Any) -> Any:
        process = getattr(self.manager, "process_item_async", None)
        if process is not None:
            return await process(item)
        return await maybe_deferred_to_future(self.manager.process_item(item, self.spider))

    async def _call(self, name: str) -> None:
        method = getattr(self.manager, f"{name}_async", None)
        if method is not None:
            await method()
        else:
            await maybe_deferred_to_future(getattr(self.manager, name)(self.spider))

    async def close(self) -> None:
        await self._call("close_spider")
