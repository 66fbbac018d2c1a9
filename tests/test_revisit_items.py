"""A revisited page's items are committed with the end of its visit, as an acked page's are
with its ack (``HA_ITEMS = "outbox"``, lib/commit.lua in lua/revisit.lua): fenced by its
lease, once per visit; a stale end commits nothing."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.revisits import Revisit, revisit
from scrapy_ha.store.wire import Commit, NewEntry
from tests.cli_seed import scrapy_ha
from tests.spiders import CatalogueSpider
from tests.test_items_commit import expire_and_release, items, stream_ids
from tests.test_items_outbox import stream
from tests.test_revisits import CONTINUOUS, visits

KEYS = Keys("ha", "s")


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


def visit(lease, found: str = "new") -> Revisit:
    return Revisit(lease.id, lease.token, 60_000, lease.payload, b"fp-a", found, 0, "60")


@deferred_f_from_coro_f
async def test_a_revisit_commits_its_pages_items_and_checkpoint(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    await q.enqueue([NewEntry(b"fp-a", 0, b'{"v":1,"u":"http://a.example/p"}')])
    (lease,) = await q.lease(1, 30_000)
    checkpoint = ("task", json.dumps({"page": 2}).encode(), 60_000)
    done = await revisit(q, visit(lease), Commit(items(1, 2), checkpoint))
    assert done.due > 0 and (done.items, done.checkpoints) == (2, 1)
    assert await stream_ids(q) == [1, 2]
    assert json.loads(await q.client.get(KEYS.checkpoint("task")))["page"] == 2
    assert await q.client.zscore(KEYS.delayed, lease.id) == done.due  # revisited, not acked
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_stale_revisit_commits_nothing(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    await q.enqueue([NewEntry(b"fp-a", 0, b'{"v":1,"u":"http://a.example/p"}')])
    (first,) = await q.lease(1, 50)
    await expire_and_release(q)  # its worker froze: the lease went back
    (second,) = await q.lease(1, 30_000)
    late = await revisit(q, visit(first), Commit(items(1)))
    assert (late.due, late.items) == (0, 0)
    assert await stream_ids(q) == []
    done = await revisit(q, visit(second), Commit(items(1)))
    assert done.due > 0 and done.items == 1 and await stream_ids(q) == [1]
    stats = await q.client.hgetall(KEYS.stats)
    assert (stats[b"items"], stats[b"items_refused"]) == (b"1", b"1")
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_revisited_pages_items_reach_the_stream_once_per_visit(redis_url, site):
    revisited = {"HA_REVISIT": {r"/item/1$": 1.0}, "HA_ITEMS": "outbox"}
    # the demo's item page never changes: without the conditional middleware every visit
    # reaches the callback and yields its item again (with it, an unchanged page yields none)
    revisited["DOWNLOADER_MIDDLEWARES"] = {"scrapy_ha.revisit.RevisitMiddleware": None}
    crawler = get_crawler(CatalogueSpider, {**CONTINUOUS, "REDIS_URL": redis_url, **revisited})
    crawling = asyncio.ensure_future(crawler.crawl_async(base_url=site.url))
    deadline = time.monotonic() + 60
    while len(visits(site)["/item/1"]) < 3:
        assert not crawling.done() and time.monotonic() < deadline, visits(site)
        await asyncio.sleep(0.2)
    stopped = await asyncio.to_thread(scrapy_ha, "stop", "catalogue", "--redis-url", redis_url)
    assert stopped.returncode == 0, stopped.stderr
    await asyncio.wait_for(crawling, 30)
    ids = [item["id"] for item in await asyncio.to_thread(stream, redis_url, "catalogue")]
    parsed = [item["id"] for item in crawler.spider.items]
    assert parsed.count(1) >= 3
    assert sorted(ids) == sorted(parsed)  # every visit's item, once: the revisits' too
