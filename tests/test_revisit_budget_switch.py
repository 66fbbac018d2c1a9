"""A crawl whose revisits were fixed, started again with ``HA_REVISIT_ADAPTIVE = True``
(what the reference suggests: the default budget keeps its bandwidth): each URL counts once
in the budget's sums (``ha:{S}:revisit_alloc``, lua/lib/revisit.lua), by what its entry
holds there (its ``e:<id>`` record), not by the interval its state remembers. Before, the
first adaptive visit of an entry revisited at a fixed interval took that interval's share
out of sums that had never counted it: in a QA run of 750 URLs switched from 30 s fixed
intervals, the load read -16.8 visits a second and the default budget 10 (the 300 URLs
first visited after the switch alone), and the multiplier, which moves only while the
load is positive, never moved again."""

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
from scrapy_ha.store.wire import NewEntry

KEYS = Keys("ha", "s")
URLS = [f"http://a.example/{n}" for n in range(3)]


def _fingerprint(request: Request) -> bytes:
    return request.url.encode()[-12:].rjust(12, b"-")


async def _held(q: RedisQueue) -> tuple[float, float]:
    """The sums of what every entry's record says it holds (load, base)."""
    records = await q.client.hgetall(KEYS.revisit_alloc)
    pairs = [v.split() for k, v in records.items() if k.startswith(b"e:")]
    return sum(float(load) for load, _ in pairs), sum(float(base) for _, base in pairs)


async def _sums(q: RedisQueue) -> tuple[float, float]:
    load, base = await q.client.hmget(KEYS.revisit_alloc, "load", "base")
    return float(load or 0), float(base or 0)


@deferred_f_from_coro_f
async def test_revisits_switched_from_fixed_to_adaptive_count_each_url_once(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    stats = MemoryStatsCollector(get_crawler())
    requests = {url: Request(url, meta={"ha_revisit": 60}) for url in URLS}
    await q.enqueue(
        [NewEntry(_fingerprint(r), 0, b'{"v":1,"u":"' + u.encode() + b'"}')
         for u, r in requests.items()]
    )  # fmt: skip

    async def visit_all(revisits: Revisits) -> None:  # as the workers end each visit
        leases = await q.lease(len(URLS), 30_000)
        assert len(leases) == len(URLS)
        for lease in leases:
            request = requests[URLS[[u.encode() in lease.payload for u in URLS].index(True)]]
            visit = revisits.visit_end(request)
            assert visit is not None
            op = EndOp("revisit", lease.id, lease.token, request, visit.interval, visit=visit)
            await end_revisit(q, None, op, stats)
        for entry in await q.client.zrange(KEYS.delayed, 0, -1):  # all due again now
            await q.client.zadd(KEYS.delayed, {entry: 0}, xx=True)

    fixed = Revisits(RevisitConfig(minimum=60), _fingerprint)
    await visit_all(fixed)  # the crawl's first runs: fixed intervals, no budget kept
    await visit_all(fixed)
    assert await _sums(q) == (0, 0)
    adaptive = Revisits(RevisitConfig(adaptive=True, minimum=60), _fingerprint)
    await visit_all(adaptive)  # started again, adaptive: its first visits
    load, base = await _sums(q)
    # each entry counted once, as its record says
    assert (load, base) == pytest.approx(await _held(q), rel=1e-4)
    assert base == pytest.approx(3 / 60)  # the default budget: their configured intervals
    assert load > 0
    await visit_all(adaptive)
    assert await _sums(q) == pytest.approx(await _held(q), rel=1e-4)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_revisits_made_fixed_then_adaptive_again_count_what_their_entries_hold(redis_url):
    """Adaptive, then fixed (its entries' records kept, their state taking the fixed
    interval), then adaptive again: each entry's first visit moves the sums from what its
    record holds, not from the fixed interval its state remembers."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    stats = MemoryStatsCollector(get_crawler())
    requests = {url: Request(url, meta={"ha_revisit": 600}) for url in URLS}
    await q.enqueue(
        [NewEntry(_fingerprint(r), 0, b'{"v":1,"u":"' + u.encode() + b'"}')
         for u, r in requests.items()]
    )  # fmt: skip

    async def visit_all(revisits: Revisits) -> None:
        leases = await q.lease(len(URLS), 30_000)
        assert len(leases) == len(URLS)
        for lease in leases:
            request = requests[URLS[[u.encode() in lease.payload for u in URLS].index(True)]]
            visit = revisits.visit_end(request)
            assert visit is not None
            op = EndOp("revisit", lease.id, lease.token, request, visit.interval, visit=visit)
            await end_revisit(q, None, op, stats)
        for entry in await q.client.zrange(KEYS.delayed, 0, -1):
            await q.client.zadd(KEYS.delayed, {entry: 0}, xx=True)

    adaptive = Revisits(RevisitConfig(adaptive=True, minimum=60), _fingerprint)
    await visit_all(adaptive)
    await visit_all(adaptive)
    await visit_all(Revisits(RevisitConfig(minimum=60), _fingerprint))  # a fixed run
    await visit_all(adaptive)  # adaptive again
    load, base = await _sums(q)
    assert (load, base) == pytest.approx(await _held(q), rel=1e-4)
    assert base == pytest.approx(3 / 600)
    await q.client.aclose()
