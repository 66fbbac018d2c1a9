"""A crawl moved from scrapy-redis may leave requests in scrapy-redis's own queue.

scrapy-redis keeps a crawl's pending requests under ``SCHEDULER_QUEUE_KEY``
(``<spider>:requests``: a sorted set, or a list with its FIFO and LIFO queues), pickled.
scrapy-ha never reads them (its requests are versioned JSON under its own keys, and a
pickle is not read from Redis), so a project that changed ``SCHEDULER`` in the middle of a
persisted scrapy-redis crawl crawled none of them, and nothing said so (a QA run). A
worker now names the key and its size at start.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import redis.exceptions

from scrapy_ha.store.wire import text

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

#: scrapy-redis's default ``SCHEDULER_QUEUE_KEY``.
QUEUE_KEY = "%(spider)s:requests"
#: How each type of key scrapy-redis's queues use is counted.
_SIZE = {"zset": "ZCARD", "list": "LLEN"}


async def name_left_queue(client: Any, settings: BaseSettings, spider: str) -> int:
    """Warn when scrapy-redis's queue of *spider* holds requests; how many (0 when there
    is none, or it could not be read: never fatal)."""
    pattern = settings.get("SCHEDULER_QUEUE_KEY") or QUEUE_KEY
    try:
        key = str(pattern) % {"spider": spider}
    except (TypeError, ValueError, KeyError):
        return 0
    try:
        kind = text(await client.type(key))
        size = int(await client.execute_command(_SIZE[kind], key)) if kind in _SIZE else 0
    except (redis.exceptions.RedisError, OSError) as exc:
        logger.debug("Could not look for scrapy-redis's queue %s: %s", key, exc)
        return 0
    if size:
        logger.warning(
            "scrapy-redis's queue %s holds %d request(s) that scrapy-ha does not read: this "
            "crawl will not fetch them. Finish them with scrapy-redis's scheduler first, or "
            "push their URLs with `scrapy-ha push %s URL...`; delete the key once they no "
            "longer matter (README, 'Coming from scrapy-redis')",
            key,
            size,
            spider,
        )
    return size
