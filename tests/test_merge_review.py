"""Where the day's features meet: a paused crawl and requests handed out from memory, the
renewal script's checks, a resent round's taken requests, and a finished crawl's pause.
Against a real redis-server."""

from __future__ import annotations

import json

import pytest
import redis
import redis.asyncio
from scrapy import Request
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.renew_wire import renew_args, worker_stats
from scrapy_ha.store.scripts import RENEW_LUA
from scrapy_ha.store.wire import Fresh, NewEntry
from tests import backqueues
from tests.spiders import CatalogueSpider

KEYS = Keys("ha", "s")


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


def open_queue(url: str) -> RedisQueue:
    return RedisQueue(redis.asyncio.Redis.from_url(url), KEYS)


@deferred_f_from_coro_f
async def test_a_paused_crawl_hands_out_nothing_from_memory(redis_url, site):
    """`scrapy-ha pause` before the worker starts: its own start request, which it could
    hand out from memory, waits in Redis like everything else (nothing downloaded, nothing
    lost) until the crawl is resumed."""
    keys = Keys("ha", "catalogue")
    client = redis.Redis.from_url(redis_url)
    client.set(keys.paused, json.dumps({"at": 0, "by": "operator"}))
    settings = {
        "SCHEDULER": "scrapy_ha.Scheduler",
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.3,
        "CLOSESPIDER_TIMEOUT": 2,
    }
    crawler = get_crawler(CatalogueSpider, settings)
    await crawler.crawl_async(base_url=site.url)
    assert crawler.stats.get_value("downloader/request_count") is None
    assert crawler.stats.get_value("finish_reason") == "closespider_timeout"
    assert backqueues.count(client, keys) == 1  # the start request, waiting for the resume
    client.close()


def test_renew_checks_its_arguments_and_keys_before_its_first_write(redis_url):
    client = redis.Redis.from_url(redis_url)
    renew = client.register_script(RENEW_LUA)
    keys = KEYS.renew_keys()
    with pytest.raises(redis.ResponseError, match="bad arguments"):
        renew(keys=keys, args=["", "w1", 1000, 0, "{}"])
    client.set(KEYS.worker_stats, "garbage")
    args = renew_args(
        [], [], worker="w1", lease_ms=1000, heartbeat_ms=1000, stats=worker_stats(0, 0)
    )
    with pytest.raises(redis.ResponseError, match="WRONGTYPE renew"):
        renew(keys=keys, args=args)
    assert client.zcard(KEYS.workers) == 0  # no heartbeat written by either call
    client.close()


@deferred_f_from_coro_f
async def test_a_resent_round_keeps_its_taken_request_in_the_grant(redis_url):
    """A round whose reply was lost is sent again: the request it had stored leased to the
    worker stays in the worker's grant, so that its lease keeper goes on renewing it."""
    q = open_queue(redis_url)
    taken = NewEntry(
        b"fp-a", 0, b"payload-a", fresh=Fresh(Request("http://a.example/"), ("ffff.1", "ffff-1"))
    )
    await q.sync(enqueue=[taken], lease=0, worker="w1")
    assert await q.granted("w1") == {b"ffff.1": b"ffff-1"}
    result = await q.sync(enqueue=[taken], lease=4, worker="w1")  # the same call again
    assert result.dropped == set()
    assert await q.granted("w1") == {b"ffff.1": b"ffff-1"}
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_finished_crawl_forgets_its_pause(redis_url):
    q = open_queue(redis_url)
    await q.client.set(KEYS.paused, json.dumps({"at": 0, "by": "operator"}))
    assert await q.finish("w1")
    assert not await q.client.exists(KEYS.paused)
    await q.client.aclose()
