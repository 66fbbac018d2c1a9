"""An entry that leaves the revisits (no rule of ``HA_REVISIT`` matches its URL any more:
its lease ends as an ack, lua/revisit.lua) gives its URL up in ``ha:{S}:revisit_urls``.
Before, the URL stayed mapped to the entry, gone: in a QA run of 300 pages taken out of
``HA_REVISIT``, ``scrapy-ha seen check`` said each ``revisited (entry 1004)`` while
``status`` counted 450 revisited URLs of 750 and none of them was visited again, and the
hash kept a field per such URL for the life of the crawl."""

from __future__ import annotations

import asyncio

import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.cli.seen import _revisited
from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.revisits import LEFT, Revisit, revisit
from scrapy_ha.store.wire import NewEntry

KEYS = Keys("ha", "s")
FP = b"fp-left-0000"


@deferred_f_from_coro_f
async def test_an_entry_that_leaves_the_revisits_gives_its_url_up(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    await q.enqueue([NewEntry(FP, 0, b'{"v":1,"u":"http://a.example/left"}')])
    (lease,) = await q.lease(1, 30_000)
    first = Revisit(lease.id, lease.token, 10, lease.payload, FP, "new", 0, "60")
    assert (await revisit(q, first)).due > 0
    assert await q.client.hget(KEYS.revisit_urls, FP) == lease.id.encode()
    assert (await _revisited(q, FP)).startswith(f"; revisited (entry {lease.id})")
    await asyncio.sleep(0.05)
    (again,) = await q.lease(1, 30_000)
    end = Revisit(again.id, again.token, -1, again.payload, FP, "left", 0, "60")
    assert (await revisit(q, end)).due == LEFT
    assert await q.client.hget(KEYS.revisit_urls, FP) is None
    assert await _revisited(q, FP) == ""  # `seen check` no longer says it is revisited
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_an_entry_that_leaves_keeps_a_url_another_entry_revisits(redis_url):
    """A double that held the URL once (it gave way) leaves: the entry that revisits the
    URL now keeps it."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    await q.enqueue([NewEntry(FP, 0, b'{"v":1,"u":"http://a.example/left"}')])
    (lease,) = await q.lease(1, 30_000)
    await q.client.hset(KEYS.revisit_urls, FP, "other")  # another entry's URL
    end = Revisit(lease.id, lease.token, -1, lease.payload, FP, "left", 0, "60")
    assert (await revisit(q, end)).due == LEFT
    assert await q.client.hget(KEYS.revisit_urls, FP) == b"other"
    await q.client.aclose()
