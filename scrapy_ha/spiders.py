"""Spiders fed from Redis, in scrapy-redis's convention, on Scrapy 2.16+.

Push start URLs to ``<spider>:start_urls`` (setting ``REDIS_START_URLS_KEY``, or
the spider's ``redis_key``), as plain URLs or JSON objects
(``{"url": ..., "method": ..., "meta": {...}, "headers": {...}, "body": ...}``).
The scheduler moves them into the queue atomically, so a worker killed at any
moment loses none. The spider stays open waiting for more (feed mode) unless
``HA_FEED = False``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider
from scrapy.spiders import CrawlSpider

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


__all__ = ["RedisCrawlSpider", "RedisSpider", "RedisSpiderMixin"]


class RedisSpiderMixin:
    """Read start URLs from Redis instead of ``start_urls``."""

    #: The Redis key to read; None means ``REDIS_START_URLS_KEY`` formatted with the name.
    redis_key: str | None = None
    #: Keep the spider open when the queue is empty, waiting for more start URLs.
    ha_feed: bool = True

    async def start(self) -> AsyncIterator[Any]:
        """Nothing: the scheduler takes start URLs from Redis."""
        return
        yield  # pragma: no cover

    def make_request_from_data(self, data: bytes) -> Request:
        """Turn one start URL entry into a request (override for another format)."""
        text = data.decode("utf-8")
        if not text.lstrip().startswith("{"):
            return Request(text.strip(), dont_filter=True)
        doc = json.loads(text)
        if not isinstance(doc, dict) or not isinstance(doc.get("url"), str):
            raise ValueError('a JSON start URL entry needs a "url" string')
        return Request(
            doc["url"],
            method=doc.get("method", "GET"),
            meta=doc.get("meta", {}),
            headers=doc.get("headers"),
            body=doc.get("body"),
            dont_filter=doc.get("dont_filter", True),
        )


class RedisSpider(RedisSpiderMixin, Spider):
    """A :class:`~scrapy.Spider` fed from Redis."""


class RedisCrawlSpider(RedisSpiderMixin, CrawlSpider):
    """A :class:`~scrapy.spiders.CrawlSpider` fed from Redis."""
