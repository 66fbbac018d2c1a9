"""A worker of a version before the back queues beside workers of this one (a rolling
upgrade): what it stores pending (a new request, a reclaimed, released or promoted entry)
goes to the old sorted set ``pending`` after the workers of this version converted it at
their start. A worker of this version converts it again once per reclaim interval, and a
crawl is not ended while the old set holds requests."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis
import redis.asyncio
import scrapy
from scrapy import signals
from scrapy.exceptions import DontCloseSpider
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.codec import encode_request
from scrapy_ha.config.scheduler import SchedulerConfig
from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.shell import Scheduler
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry
from tests.spiders import CatalogueSpider
from tests.test_frontier_upgrade import plant_old

pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")

KEYS = Keys("ha", "catalogue")
#: The path the old worker stored: an item page the catalogue links nowhere.
PLANTED = "/flaky/77"
#: Seconds a spider holding its close waits for the planted page at most.
HOLD = 30.0


def settings(redis_url: str, reclaim_interval: float = 0.5) -> dict[str, Any]:
    return {
        "SCHEDULER": "scrapy_ha.Scheduler",
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.3,
        "HA_RECLAIM_INTERVAL": reclaim_interval,
        "LOG_LEVEL": "INFO",
    }


def plant(redis_client: Any, spider: CatalogueSpider, base_url: str) -> None:
    """The request an earlier worker stores pending: its old form, next sequence number."""
    request = scrapy.Request(base_url + PLANTED, callback=spider.parse_item)
    seq = int(redis_client.incr(KEYS.seq))
    plant_old(redis_client, KEYS, [(seq, 0, encode_request(request, spider))], lifo=True)


class PlantingSpider(CatalogueSpider):
    """Plants the old worker's request once (:meth:`plant_once`), told of its idleness."""

    name = "catalogue"
    redis_client: Any = None

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> PlantingSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.on_idle, signal=signals.spider_idle)
        spider.base_url = kwargs["base_url"]
        spider.planted = False
        return spider

    def plant_once(self) -> None:
        if not self.planted:
            self.planted = True
            self.plant()

    def plant(self) -> None:
        plant(self.redis_client, self, self.base_url)

    def on_idle(self, spider: Any) -> None:
        raise NotImplementedError


class HoldingSpider(PlantingSpider):
    """Plants the old worker's request at its first response; keeps the crawl open until
    the planted page was crawled (at most :data:`HOLD` seconds of idleness)."""

    idle_since: float | None = None

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> HoldingSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.on_response, signal=signals.response_received)
        return spider  # type: ignore[return-value]

    def on_response(self, response: Any, request: Any, spider: Any) -> None:
        self.plant_once()

    def on_idle(self, spider: Any) -> None:
        if any(item["id"] == 77 for item in self.items):
            return
        self.idle_since = self.idle_since or time.monotonic()
        if time.monotonic() - self.idle_since < HOLD:
            raise DontCloseSpider


@deferred_f_from_coro_f
async def test_a_request_an_older_worker_stores_pending_is_crawled(redis_url, redis_client, site):
    PlantingSpider.redis_client = redis_client
    crawler = get_crawler(HoldingSpider, settings(redis_url))
    await crawler.crawl_async(base_url=site.url)
    ids = sorted(item["id"] for item in crawler.spider.items)
    assert ids == [*range(1, 51), 77]  # the old worker's request crawled too
    assert not redis_client.exists(KEYS.legacy_pending)


class ClosingSpider(PlantingSpider):
    """Plants the old worker's request when the crawl looks finished (its first idle)."""

    def on_idle(self, spider: Any) -> None:
        self.plant_once()


@deferred_f_from_coro_f
async def test_a_crawl_is_not_ended_while_the_old_pending_set_holds_requests(
    redis_url, redis_client, site
):
    PlantingSpider.redis_client = redis_client
    # no reclaim (nor its conversion) after the worker's first round: its close converts
    crawler = get_crawler(ClosingSpider, settings(redis_url, reclaim_interval=3600))
    await crawler.crawl_async(base_url=site.url)
    assert len(crawler.spider.items) == 50
    # the request is in its back queue for the next worker, the crawl kept with it (before,
    # the finish cleared the crawl, its dupefilter and run with it, and left the request
    # in the old set, which no running worker reads)
    assert not redis_client.exists(KEYS.legacy_pending)
    assert redis_client.get(KEYS.queued) == b"1"
    assert redis_client.hget(KEYS.run, "open") == b"1"


@deferred_f_from_coro_f
async def test_a_reclaim_is_counted_when_the_old_pending_set_holds_garbage(redis_url, redis_client):
    """The reclaim converts the old pending set after it moved the expired leases: a set
    of another type there (garbage) fails the conversion, and that failure (set aside by
    the session's loop) hid what the reclaim did: a request dead-lettered as poison was
    neither counted, said nor archived, the reclaimed leases neither counted nor said."""
    keys = Keys("ha", "garbage")
    crawler = get_crawler(settings_dict={"REDIS_URL": redis_url})
    crawler._apply_settings()
    config = SchedulerConfig(worker_id="w", max_lease_expiries=1)
    scheduler = Scheduler(crawler, config)
    queue = RedisQueue(redis.asyncio.Redis.from_url(redis_url), keys)
    scheduler.session.queue = queue
    pages = [b'{"v":1,"u":"http://a.test/%d"}' % n for n in (1, 2)]
    await queue.sync(enqueue=[NewEntry(b"", 0, page) for page in pages])
    handed, buffered = (await queue.sync(lease=2, lease_ms=1, promote=10, worker="x")).leases
    pair = (handed.id, handed.token)
    await queue.renew([pair], handed=[pair], worker="x", lease_ms=1, heartbeat_ms=1)
    redis_client.set(keys.legacy_pending, b"garbage")
    await asyncio.sleep(0.05)  # both leases expired
    try:
        with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
            await scheduler.session.ends.reclaim(config)
        assert crawler.stats.get_value("ha/dead/poison") == 1
        assert crawler.stats.get_value("ha/reclaimed") == 1
    finally:
        await queue.client.aclose()


class GarbageSpider(ClosingSpider):
    """Writes a key of another type where the old pending set goes when the crawl looks
    finished (its first idle)."""

    def plant(self) -> None:
        self.redis_client.set(KEYS.legacy_pending, b"garbage")


@deferred_f_from_coro_f
async def test_garbage_in_the_old_pending_set_is_set_aside_at_the_close(
    redis_url, redis_client, site
):
    """A finished close converts the old pending set: a key of another type there failed
    it, and with it the close ("Gave up the close with Redis"): the crawl was not ended, its
    run left open and its dupefilter kept, and its next run crawled nothing."""
    PlantingSpider.redis_client = redis_client
    crawler = get_crawler(GarbageSpider, settings(redis_url, reclaim_interval=3600))
    await crawler.crawl_async(base_url=site.url)
    assert len(crawler.spider.items) == 50
    assert redis_client.get(KEYS.finish_record) == b"done"  # the crawl ended
    assert redis_client.keys(KEYS.legacy_pending + ":corrupt:*")  # the garbage kept aside
    crawler = get_crawler(CatalogueSpider, settings(redis_url, reclaim_interval=3600))
    await crawler.crawl_async(base_url=site.url)
    assert len(crawler.spider.items) == 50  # a new run
