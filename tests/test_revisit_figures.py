"""What Redis counts of revisits adds up with what it holds (lua/revisit.lua, lua/dead.lua):
a revisit retried and then failed ends its retries as ``retry_dead`` (every retried request
that ends is ``retry_ok`` or ``retry_dead``), and a dead-lettered revisit leaves
``ha:{S}:revisits`` (the revisited URLs status and the dashboard count) at once. Against a
real Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.revisits import Revisit, revisit
from scrapy_ha.store.wire import NewEntry

KEYS = Keys("ha", "s")
PAYLOAD = b'{"v":1,"u":"http://a.test/0"}'


async def one_page(redis_url: str) -> RedisQueue:
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    await q.enqueue([NewEntry(b"p0", 0, PAYLOAD)])
    return q


async def lease_when_due(q: RedisQueue) -> Any:
    for _ in range(500):
        leased = await q.lease(1, 30_000)
        if leased:
            return leased[0]
        await asyncio.sleep(0.01)
    raise AssertionError("the entry never came due")


def end(lease: Any, found: str, ms: int = 10) -> Revisit:
    return Revisit(lease.id, lease.token, ms, lease.payload, b"fp0", found, 0, "60", None)


async def counters(q: RedisQueue) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in (await q.client.hgetall(KEYS.stats)).items()}


@deferred_f_from_coro_f
async def test_a_retried_visit_that_fails_counts_as_a_retry_that_failed(redis_url):
    """Before, its retried entry was deleted and counted neither: "retry success (0 ok, 0
    dead)" with a retry in ``retried``."""
    q = await one_page(redis_url)
    lease = await lease_when_due(q)
    assert await q.retry_later(lease.id, lease.token, 0, lease.payload, failure_class="server")
    again = await lease_when_due(q)
    assert (await revisit(q, end(again, "failed"))).due > 0
    stats = await counters(q)
    assert (stats["retried"], stats.get("retry_ok", 0), stats.get("retry_dead", 0)) == (1, 0, 1)
    assert "acked" not in stats and not await q.client.hlen(KEYS.retried)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_dead_lettered_revisit_leaves_the_revisits_set(redis_url):
    """Before, it stayed there up to a day after its due time: counted as a revisited URL."""
    q = await one_page(redis_url)
    lease = await lease_when_due(q)
    assert (await revisit(q, end(lease, "new"))).due > 0
    assert await q.client.zscore(KEYS.revisits, lease.id) is not None
    again = await lease_when_due(q)
    assert await q.dead_letter(again.id, again.token, {"class": "gone"}) == 1
    assert await q.client.zscore(KEYS.revisits, lease.id) is None
    await q.client.aclose()
