"""A crawl stored by a version before the back queues (one sorted set ``pending`` of
``"<id> <payload>"`` members) is converted by the first worker of this version that opens
it: every request keeps its id and its place, and the crawl goes on to its end."""

from __future__ import annotations

import json

import redis.asyncio
import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.request import RequestFingerprinter
from scrapy.utils.test import get_crawler

from scrapy_ha.codec import encode_request
from scrapy_ha.keys import Keys
from scrapy_ha.store.frontier import CONVERT_BATCH
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.scripts import PRIORITY_STEP
from tests import backqueues
from tests.spiders import CatalogueSpider

START_PART = PRIORITY_STEP // 2


def old_score(priority: int, seq: int, lifo: bool) -> int:
    """The pending score of the earlier version (lib/priority.lua pending_score)."""
    return -priority * PRIORITY_STEP + (START_PART - seq if lifo else seq)


def plant_old(client, keys: Keys, entries: list[tuple[int, int, bytes]], lifo: bool) -> None:
    """(seq, priority, payload) entries as the earlier version stored them pending."""
    members = {
        b"%d %s" % (seq, payload): old_score(prio, seq, lifo) for seq, prio, payload in entries
    }
    client.zadd(keys.legacy_pending, members)
    client.set(keys.seq, max(seq for seq, _, _ in entries))


def payload(host: str, n: int) -> bytes:
    return b'{"v":1,"u":"http://%s/%d"}' % (host.encode(), n)


@deferred_f_from_coro_f
async def test_an_old_crawl_is_converted_with_its_ids_and_its_order(redis_url, redis_client):
    keys = Keys("ha", "old")
    entries = [
        (n, n % 3 - 1, payload(f"h{n % 4}.test", n)) for n in range(1, 2 * CONVERT_BATCH + 8)
    ]
    plant_old(redis_client, keys, entries, lifo=True)
    old_order = [m.split(b" ", 1)[0] for m in redis_client.zrange(keys.legacy_pending, 0, -1)]
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), keys, order="lifo")
    assert (await q.counts()).pending == len(entries)  # counted before the conversion too
    assert await q.upgrade() == len(entries)  # in three calls of at most CONVERT_BATCH
    assert not redis_client.exists(keys.legacy_pending)
    assert (await q.counts()).pending == len(entries)
    assert await q.upgrade() == 0  # nothing left: a second worker converts nothing
    leases = await q.lease(len(entries), 30000)
    assert [lease.id.encode() for lease in leases] == old_order  # ids and order kept
    assert {json.loads(lease.payload)["u"] for lease in leases} == {
        json.loads(p)["u"] for _, _, p in entries
    }
    assert {q.decode() for q in redis_client.keys("ha:{old}:q:*")} == set()  # all leased
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_worker_converts_the_crawl_it_joins_and_crawls_it_to_the_end(
    redis_url, redis_client, site
):
    keys = Keys("ha", "catalogue")
    spider = CatalogueSpider(base_url=site.url)
    requests = [
        scrapy.Request(f"{site.url}/item/{n}", callback=spider.parse_item) for n in (3, 7, 44)
    ]
    items = [encode_request(request, spider) for request in requests]
    plant_old(redis_client, keys, [(900 + i, 0, p) for i, p in enumerate(items)], lifo=True)
    # their fingerprints are in the dupefilter, as the earlier version left them
    fingerprints = [RequestFingerprinter().fingerprint(r)[:12] for r in requests]
    redis_client.sadd(keys.dupefilter, *fingerprints)
    settings = {
        "SCHEDULER": "scrapy_ha.Scheduler",
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.3,
        "SCHEDULER_PERSIST": True,
        "LOG_LEVEL": "INFO",
    }
    crawler = get_crawler(CatalogueSpider, settings)
    await crawler.crawl_async(base_url=site.url)
    ids = sorted(i["id"] for i in crawler.spider.items)
    assert ids == list(range(1, 51))  # the 50 of the site, the converted three among them
    assert not redis_client.exists(keys.legacy_pending)
    assert backqueues.count(redis_client, keys) == 0


@deferred_f_from_coro_f
async def test_an_old_pending_score_past_every_priority_is_converted(redis_url, redis_client):
    """A score no version wrote (+inf or -inf, by hand) failed the conversion with a Lua
    error: the worker could not start, and one that was running failed its reclaims and
    gave up its close (the crawl not ended). It goes to the nearest priority."""
    keys = Keys("ha", "inf")
    members = {b"1 " + payload("a.test", 1): "+inf", b"2 " + payload("a.test", 2): "-inf"}
    redis_client.zadd(keys.legacy_pending, members)
    redis_client.set(keys.seq, 2)
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), keys)
    try:
        assert await q.upgrade() == 2
        assert not redis_client.exists(keys.legacy_pending)
        assert [lease.id for lease in await q.lease(5, 30000)] == ["2", "1"]
    finally:
        await q.client.aclose()
