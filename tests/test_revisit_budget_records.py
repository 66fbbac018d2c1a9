"""Adaptive revisits' budget (``ha:{S}:revisit_alloc``, lua/lib/revisit.lua) moves by what
each entry's record (``e:<id>``) says it holds, not by the interval its request's state
remembers: the two differ for an entry a fixed visit of an earlier version left recorded,
and for a double whose configured interval changed since it was recorded. And an entry that
ends as a double leaves no record behind, fixed or adaptive."""

from __future__ import annotations

import pytest
import redis.asyncio
from scrapy import Request
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.config.continuous import RevisitConfig
from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.outbox import EndOp
from scrapy_ha.scheduler.revisits import Revisits
from scrapy_ha.scheduler.session.revisit import end_revisit
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.revisits import DOUBLE
from scrapy_ha.store.wire import NewEntry

KEYS = Keys("ha", "s")
URL = "http://a.example/page"


def _fingerprint(request: Request) -> bytes:
    return request.url.encode()[-12:].rjust(12, b"-")


def _payload(url: str) -> bytes:
    return b'{"v":1,"u":"' + url.encode() + b'"}'


async def _records(q: RedisQueue) -> dict[str, tuple[float, float]]:
    h = await q.client.hgetall(KEYS.revisit_alloc)
    return {
        k.decode()[2:]: tuple(float(x) for x in v.split())  # type: ignore[misc]
        for k, v in h.items()
        if k.startswith(b"e:")
    }


async def _sums(q: RedisQueue) -> tuple[float, float]:
    load, base = await q.client.hmget(KEYS.revisit_alloc, "load", "base")
    return float(load or 0), float(base or 0)


async def _all_due(q: RedisQueue) -> None:
    for entry in await q.client.zrange(KEYS.delayed, 0, -1):
        await q.client.zadd(KEYS.delayed, {entry: 0}, xx=True)


class Crawl:
    """Entries of the crawl, each with the request a worker holds for it."""

    def __init__(self, q: RedisQueue) -> None:
        self.q = q
        self.stats = MemoryStatsCollector(get_crawler())
        self.requests: dict[str, Request] = {}

    async def add(self, url: str, interval: float) -> str:
        # (its own fingerprint for the dupefilter: a copy queued with dont_filter)
        self.n = getattr(self, "n", 0) + 1
        await self.q.enqueue([NewEntry(b"copy-%08d" % self.n, 0, _payload(url))])
        (lease,) = await self.q.lease(1, 30_000)
        self.requests[lease.id] = Request(url, meta={"ha_revisit": interval})
        self.pending = lease
        return lease.id

    async def end(self, lease, revisits: Revisits, interval: float | None = None) -> int:
        request = self.requests[lease.id]
        if interval is not None:
            request.meta["ha_revisit"] = interval
        visit = revisits.visit_end(request)
        assert visit is not None
        op = EndOp("revisit", lease.id, lease.token, request, visit.interval, visit=visit)
        assert await end_revisit(self.q, None, op, self.stats)
        return (await self.q.client.zscore(KEYS.delayed, lease.id) and 1) or DOUBLE

    async def visit_all(self, revisits: Revisits, interval: float | None = None) -> None:
        await _all_due(self.q)
        leases = await self.q.lease(10, 30_000)
        for lease in sorted(leases, key=lambda lease: int(lease.id)):
            await self.end(lease, revisits, interval)


ADAPTIVE = RevisitConfig(adaptive=True, minimum=60)
FIXED = RevisitConfig(minimum=60)


@deferred_f_from_coro_f
async def test_a_double_ended_under_fixed_settings_leaves_no_record_in_the_budget(redis_url):
    """A, adaptive, dead-lettered; B, a copy, takes its URL; A requeued takes it back; the
    crawl, fixed now, visits both: B ends as the double. Its record and its share of the sums
    went with it (before: kept for the life of the crawl, an entry gone counted in the load)."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    crawl = Crawl(q)
    adaptive = Revisits(ADAPTIVE, _fingerprint)
    a = await crawl.add(URL, 600)
    await crawl.end(crawl.pending, adaptive)
    await _all_due(q)
    (lease,) = await q.lease(1, 30_000)
    assert await q.dead_letter(a, lease.token, {"class": "gone"}, payload=lease.payload)
    b = await crawl.add(URL, 600)  # a copy (dont_filter): A is dead, B takes the URL
    await crawl.end(crawl.pending, adaptive)
    assert await q.client.hget(KEYS.revisit_urls, _fingerprint(crawl.requests[b])) == b.encode()
    assert await q.requeue_dead([(a, 0, lease.payload)]) == 1  # A takes it back
    assert set(await _records(q)) == {a, b}
    await crawl.visit_all(Revisits(FIXED, _fingerprint))  # fixed now: B is the double
    assert await q.client.zscore(KEYS.delayed, b) is None
    assert await _records(q) == {}
    assert await _sums(q) == pytest.approx((0, 0), abs=1e-9)
    await crawl.visit_all(adaptive)  # adaptive again: A alone counts
    assert set(await _records(q)) == {a}
    held = tuple(map(sum, zip(*(await _records(q)).values(), strict=True)))
    assert await _sums(q) == pytest.approx(held)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_double_takes_out_what_its_record_holds_after_its_interval_changed(redis_url):
    """B recorded at 60 s, its rule made 600 s, then a double: the sums lose 1/60, what
    they held for it (before: 1/600, from the configured interval it has now)."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    crawl = Crawl(q)
    adaptive = Revisits(ADAPTIVE, _fingerprint)
    a = await crawl.add(URL, 60)
    await crawl.end(crawl.pending, adaptive)
    await _all_due(q)
    (lease,) = await q.lease(1, 30_000)
    assert await q.dead_letter(a, lease.token, {"class": "gone"}, payload=lease.payload)
    await crawl.add(URL, 60)  # B
    await crawl.end(crawl.pending, adaptive)
    assert await q.requeue_dead([(a, 0, lease.payload)]) == 1
    await crawl.visit_all(adaptive, 600)  # the rule says 600 s now: B is the double
    assert set(await _records(q)) == {a}
    held = tuple(map(sum, zip(*(await _records(q)).values(), strict=True)))
    assert await _sums(q) == pytest.approx(held, rel=1e-9)
    assert held[1] > 0
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_record_an_earlier_version_left_through_a_fixed_visit_is_counted_once(redis_url):
    """Adaptive, then a fixed run of a version before 54560eea (its fixed visits left each
    entry's record and share in the sums, while its state took the fixed interval), then
    adaptive again: each entry's visit moves the sums from its record (before: from the
    fixed interval, the sums then no longer the records' total)."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    crawl = Crawl(q)
    adaptive = Revisits(ADAPTIVE, _fingerprint)
    for n in range(3):
        await crawl.add(f"{URL}/{n}", 600)
        await crawl.end(crawl.pending, adaptive)
    await crawl.visit_all(adaptive)
    alloc_before = await q.client.hgetall(KEYS.revisit_alloc)
    await crawl.visit_all(Revisits(FIXED, _fingerprint))
    # what the earlier version left: the records and the sums as the adaptive run had them
    await q.client.hset(KEYS.revisit_alloc, mapping=alloc_before)
    await crawl.visit_all(adaptive)
    held = tuple(map(sum, zip(*(await _records(q)).values(), strict=True)))
    assert await _sums(q) == pytest.approx(held, rel=1e-9)
    assert held[1] == pytest.approx(3 / 600)
    await q.client.aclose()
