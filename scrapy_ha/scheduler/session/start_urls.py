"""Start URLs read from a Redis key (scrapy-redis's ``RedisSpider`` protocol).

Each round the session moves up to ``REDIS_START_URLS_BATCH_SIZE`` entries from the start
key into the queue, in one script (an entry leaves the start key only once queued). An entry
the spider cannot turn into a request is dropped with an ERROR, alone. On a Redis Cluster a
start key outside the crawl's slot is refused at open (:func:`check_start_key`).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import redis
from scrapy import Request

from scrapy_ha.codec import encode_request
from scrapy_ha.config.validate import ConfigError, start_key
from scrapy_ha.spiders import RedisSpiderMixin
from scrapy_ha.store.url import uses_cluster
from scrapy_ha.store.wire import NewEntry

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

    from scrapy_ha.config.scheduler import SchedulerConfig
    from scrapy_ha.scheduler.admission import Admission
    from scrapy_ha.store.queue import RedisQueue

logger = logging.getLogger(__name__)

#: Seconds between two ERRORs for a start key of the wrong type, while it stays so.
WRONG_TYPE_SAY_EVERY = 60.0


async def peek_start_urls(client: Any, key: str, *, as_set: bool, batch: int) -> list[bytes]:
    """Up to *batch* entries of a scrapy-redis start-URL key (a list's head, or members of
    a set), left in place: the queue's ``feed`` moves them."""
    if as_set:
        return list(await client.srandmember(key, batch))
    return list(await client.lrange(key, 0, batch - 1))


class StartUrls:
    """Feeds the queue from a spider's start-URL key; ``key`` is None for other spiders."""

    def __init__(self, crawler: Crawler, admission: Admission, *, feed_mode: bool) -> None:
        self.crawler = crawler
        self.admission = admission
        self.key: str | None = None
        self.feed_mode = feed_mode  # wait for more start URLs instead of closing when done
        self.spider: Spider | None = None
        self.as_set = False  # REDIS_START_URLS_AS_SET: a set, not a list
        self._wrong_type_said: float | None = None  # (monotonic time of the last ERROR)

    def setup(self, spider: Spider, config: SchedulerConfig) -> None:
        if not isinstance(spider, RedisSpiderMixin):
            if is_scrapy_redis_spider(spider):
                logger.warning(SCRAPY_REDIS_SPIDER, spider.name)
            return
        self.spider = spider
        self.as_set = config.start_urls_as_set
        self.key = spider.redis_key or start_key(config.start_urls_key, spider.name)
        if not config.feed_given:
            self.feed_mode = spider.ha_feed
        if idle := getattr(spider, "max_idle_time", None):  # scrapy-redis's spider attribute
            logger.warning(MAX_IDLE_TIME, spider.name, idle)
        logger.info(
            "Reading start URLs from Redis key %s%s",
            self.key,
            " (feed mode: waiting for more)" if self.feed_mode else "",
        )

    async def feed(self, queue: RedisQueue, batch: int) -> None:
        assert self.key is not None and self.crawler.stats is not None
        try:
            raw = await peek_start_urls(queue.client, self.key, as_set=self.as_set, batch=batch)
        except redis.exceptions.ResponseError as exc:
            if not str(exc).startswith("WRONGTYPE"):
                raise
            # said, and the round goes on: raised, it failed every round (acks, leases) a
            # second for ever, as "Redis refused a scrapy-ha command (WRONGTYPE ...)"
            await self._wrong_type(queue.client)
            return
        if not raw:
            return
        entries = [self._entry(data) for data in raw]
        added = await queue.feed(self.key, as_set=self.as_set, raw=raw, entries=entries)
        if added > 0:
            self.crawler.stats.inc_value("ha/start_urls", added)

    async def _wrong_type(self, client: Any) -> None:
        """The start key holds another type than the spider reads: said once a minute."""
        now = time.monotonic()
        if self._wrong_type_said is not None and now - self._wrong_type_said < WRONG_TYPE_SAY_EVERY:
            return
        self._wrong_type_said = now
        found = await client.type(self.key)
        found = found.decode() if isinstance(found, bytes) else str(found)
        wanted = "set" if self.as_set else "list"
        logger.error(
            "Start URL key %s is a %s, not the %s this worker reads "
            "(REDIS_START_URLS_AS_SET=%s): no start URL is read from it, the crawl goes on "
            "with what it holds. Push start URLs with %s, or set REDIS_START_URLS_AS_SET=%s "
            "for a set; scrapy-redis's REDIS_START_URLS_AS_ZSET (a sorted set) is not read: "
            "move its members into a list (said again once a minute while it lasts)",
            self.key,
            found,
            wanted,
            self.as_set,
            "SADD" if self.as_set else "LPUSH or RPUSH",
            not self.as_set,
        )

    def _entry(self, data: bytes) -> NewEntry:
        assert isinstance(self.spider, RedisSpiderMixin) and self.crawler.stats is not None
        try:
            request = one_request(self.spider.make_request_from_data(data))
            self.admission.note_priority(request)
            return NewEntry(
                self.admission.fingerprint(request),
                request.priority,
                encode_request(request, self.spider),
            )
        except Exception as exc:
            self.crawler.stats.inc_value("ha/start_urls_invalid")
            logger.error(
                "Start URL entry %r in %s is invalid and was dropped: %s",
                data[:200],
                self.key,
                exc,
            )
            return NewEntry(b"", 0, b"")


#: Said at open for a spider of scrapy-redis's: it still runs on the scheduler (it pops
#: its start URLs itself, when idle), silently, without the feed's guarantee.
SCRAPY_REDIS_SPIDER = (
    "Spider %s is scrapy-redis's RedisSpider or RedisCrawlSpider: it pops its start URLs "
    "from Redis itself, before their requests are stored, so a worker killed between the "
    "two loses them. Import RedisSpider / RedisCrawlSpider from scrapy_ha.spiders instead "
    "(an entry leaves Redis in the step that queues its request)"
)


#: Said at open for a spider that kept scrapy-redis's ``max_idle_time`` attribute.
MAX_IDLE_TIME = (
    "Spider %s sets max_idle_time = %r, scrapy-redis's, which does nothing in scrapy-ha: a "
    "RedisSpider waits for start URLs for ever (ha_feed = True); ha_feed = False (or "
    "HA_FEED = False) closes it once the crawl is empty"
)


def is_scrapy_redis_spider(spider: Spider) -> bool:
    """Whether *spider* is built on scrapy-redis's ``RedisMixin`` (not imported: a
    project without scrapy-redis's spiders loads none of them)."""
    return any(
        cls.__module__ == "scrapy_redis.spiders" and cls.__name__ == "RedisMixin"
        for cls in type(spider).__mro__
    )


def one_request(made: object) -> Request:
    """What ``make_request_from_data`` made, if it is one request; else a TypeError that
    says so (scrapy-redis's takes an iterable of requests too: a list failed as "'list'
    object has no attribute 'priority'")."""
    if isinstance(made, Request):
        return made
    raise TypeError(
        f"make_request_from_data returned {type(made).__name__}, not one Request: each "
        "start URL entry is moved into the queue as exactly one request (scrapy-redis "
        "also took a list of them: push one entry per request instead)"
    )


#: What REDIS_START_URLS_KEY must look like on a Redis Cluster (the crawl's hash tag).
CLUSTER_START_URLS_KEY = "{%(name)s}:start_urls"


def check_start_key(settings: BaseSettings, start_key: str, crawl_key: str) -> None:
    """Refuse, on a Redis Cluster, a start-URL key in another slot than the crawl's keys.

    The script that feeds start URLs into the queue touches both: on a cluster, keys of
    two slots fail with CROSSSLOT on every call. scrapy-redis's default key
    (``<spider>:start_urls``) has no hash tag, so it stays the default for standalone
    Redis and is refused here with the fix.
    """
    from redis.crc import key_slot  # noqa: PLC0415 - only needed on this path

    if not uses_cluster(settings) or key_slot(start_key.encode()) == key_slot(crawl_key.encode()):
        return
    raise ConfigError(
        f"the start URLs key {start_key!r} (REDIS_START_URLS_KEY, or the spider's redis_key) "
        f"is outside the hash tag of the crawl's keys ({crawl_key!r}): on a Redis Cluster the "
        f"feed script would fail with CROSSSLOT. Set REDIS_START_URLS_KEY = "
        f'"{CLUSTER_START_URLS_KEY}" (and push start URLs to that key)'
    )
