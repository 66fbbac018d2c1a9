"""Spiders fed from Redis, in scrapy-redis's convention, on Scrapy 2.16+.

Push start URLs to ``<spider>:start_urls`` (setting ``REDIS_START_URLS_KEY``, or
the spider's ``redis_key``), as plain URLs or JSON objects
(``{"url": ..., "method": ..., "meta": {...}, "headers": {...}, "body": ...}``; any
other key is a form field, as in scrapy-redis: the request a ``FormRequest`` with that
``formdata`` would be).
The scheduler moves them into the queue atomically, so a worker killed at any
moment loses none. The spider stays open waiting for more (feed mode) unless
``HA_FEED = False``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit, urlunsplit

from scrapy import Request, Spider
from scrapy.spiders import CrawlSpider

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


__all__ = ["RedisCrawlSpider", "RedisSpider", "RedisSpiderMixin"]

#: The keys of a JSON start URL entry that make its request; any other key is a form field
#: (:func:`_form_request`), as in scrapy-redis (``{"url": ..., "q": "x"}`` fetches ``url?q=x``;
#: with ``"method": "POST"`` it posts ``q=x``).
ENTRY_KEYS = frozenset({"url", "method", "meta", "headers", "body", "dont_filter"})


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
        """Turn one start URL entry into one request (override for another format).

        Return exactly one :class:`~scrapy.Request`: the entry leaves Redis in the step that
        queues it. scrapy-redis also takes a list of requests; here anything else drops
        the entry with an ERROR (stat ``ha/start_urls_invalid``): push one entry per
        request instead."""
        text = data.decode("utf-8")
        if not text.lstrip().startswith("{"):
            return Request(text.strip(), dont_filter=True)
        doc = json.loads(text)
        if not isinstance(doc, dict) or not isinstance(doc.get("url"), str):
            raise ValueError('a JSON start URL entry needs a "url" string')
        common = {
            "method": doc.get("method", "GET"),
            "meta": doc.get("meta", {}),
            "headers": doc.get("headers"),
            "dont_filter": doc.get("dont_filter", True),
        }
        formdata = {key: value for key, value in doc.items() if key not in ENTRY_KEYS}
        if not formdata:
            return Request(doc["url"], body=doc.get("body"), **common)
        if "body" in doc:
            raise ValueError(f'a JSON start URL entry has a "body" and form fields {formdata}')
        return _form_request(doc["url"], formdata, common)


def _form_request(url: str, formdata: dict[str, Any], common: dict[str, Any]) -> Request:
    """A plain :class:`~scrapy.Request` built as ``FormRequest(url, formdata=formdata)``
    builds one (the form url-encoded in the body of a POST, else as the URL's query), but
    of no class of its own: ``scrapy.http.request.form`` is deprecated on Scrapy 2.16 (a
    warning at its import, in every worker that read such an entry back)."""
    fields = []
    for name, values in formdata.items():
        for value in values if isinstance(values, list) else [values]:
            if not isinstance(value, str):
                raise ValueError(f"form field {name!r} of a JSON start URL entry is no string")
            fields.append((name, value))
    query = urlencode(fields, doseq=True)
    request = Request(url, **common)
    if request.method == "POST":
        request.headers.setdefault(b"Content-Type", b"application/x-www-form-urlencoded")
        return request.replace(body=query)
    return request.replace(url=urlunsplit(urlsplit(request.url)._replace(query=query)))


class RedisSpider(RedisSpiderMixin, Spider):
    """A :class:`~scrapy.Spider` fed from Redis."""


class RedisCrawlSpider(RedisSpiderMixin, CrawlSpider):
    """A :class:`~scrapy.spiders.CrawlSpider` fed from Redis."""
