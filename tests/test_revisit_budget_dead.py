"""Adaptive revisits' budget (``ha:{S}:revisit_alloc``, lua/lib/revisit.lua) and dead letters:
a revisit entry dead-lettered (a page gone for good) leaves the sums of the intervals' load,
so the crawl's other revisits are not slowed by a URL no longer visited, and a requeue of
the dead letter brings it back into them."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
import redis.asyncio
from scrapy import Request
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.config.continuous import RevisitConfig, RevisitState
from scrapy_ha.config.freshness import multiplier_range
from scrapy_ha.keys import Keys
from scrapy_ha.metakeys import REVISIT_STATE
from scrapy_ha.scheduler.outbox import EndOp
from scrapy_ha.scheduler.revisits import Revisits
from scrapy_ha.scheduler.session.revisit import end_revisit
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.revisits import LEFT, Revisit, revisit
from scrapy_ha.store.wire import NewEntry

KEYS = Keys("ha", "s")


async def scheduled(q: RedisQueue, name: str, interval_ms: int) -> str:
    """An entry leased, then revisited adaptively every *interval_ms* (its first visit)."""
    url = b'{"v":1,"u":"http://a.example/' + name.encode() + b'"}'
    await q.enqueue([NewEntry(name.encode(), 0, url)])
    (lease,) = await q.lease(1, 30_000)
    load = 1000 / interval_ms  # visits a second: what the worker adds at a first visit
    allocation = (load, 1 / 50, 0.0, 13.2, 0.0, 0.0, *multiplier_range(60, 3600))
    end = Revisit(
        lease.id, lease.token, interval_ms, lease.payload, name.encode(), "new", 0, "60", allocation
    )
    assert (await revisit(q, end)).due > 0
    return lease.id


async def sums(q: RedisQueue) -> tuple[float, float]:
    load, base = await q.client.hmget(KEYS.revisit_alloc, "load", "base")
    return float(load), float(base)


@deferred_f_from_coro_f
async def test_a_dead_lettered_revisit_leaves_the_budget_and_a_requeue_brings_it_back(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    await scheduled(q, "stays", 50_000)  # 0.02 visits a second
    gone = await scheduled(q, "gone", 10)  # 100 a second, due at once
    assert await sums(q) == pytest.approx((100.02, 0.04))
    await asyncio.sleep(0.05)
    (lease,) = await q.lease(1, 30_000)
    assert lease.id == gone
    info = {"class": "gone", "reason": "HTTP 404"}
    assert await q.dead_letter(lease.id, lease.token, info, payload=lease.payload) == 1
    assert await sums(q) == pytest.approx((0.02, 0.02))  # the other URL's alone
    record = json.loads(await q.client.hget(KEYS.dead_info, gone))
    assert record["revisit"] == pytest.approx([100.0, 0.02])
    assert await q.requeue_dead([(gone, 0, lease.payload)]) == 1
    assert await sums(q) == pytest.approx((100.02, 0.04))  # back, as if it had not left
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_fixed_revisit_no_longer_revisited_leaves_the_revisits(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    url = b'{"v":1,"u":"http://a.example/fixed"}'
    await q.enqueue([NewEntry(b"fixed", 0, url)])
    (lease,) = await q.lease(1, 30_000)
    first = Revisit(lease.id, lease.token, 10, lease.payload, b"fixed", "new", 0, "60")
    assert (await revisit(q, first)).due > 0
    assert await q.client.zscore(KEYS.revisits, lease.id) is not None
    await asyncio.sleep(0.05)
    (again,) = await q.lease(1, 30_000)
    end = Revisit(again.id, again.token, -1, again.payload, b"fixed", "left", 0, "60")
    assert (await revisit(q, end)).due == LEFT
    assert await q.client.zscore(KEYS.revisits, again.id) is None
    assert await q.client.zscore(KEYS.delayed, again.id) is None
    assert await q.client.hget(KEYS.stats, "revisit_left") == b"1"
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_an_entry_no_longer_revisited_leaves_the_budget_and_its_record(redis_url):
    """A page revisited adaptively that no rule of HA_REVISIT matches any more ends as an
    ack with a negative interval: its entry leaves the revisits, the sums and its ``e:<id>``
    record (which would otherwise stay for the life of the crawl)."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    await scheduled(q, "stays", 50_000)
    gone = await scheduled(q, "gone", 10)
    assert await q.client.hexists(KEYS.revisit_alloc, f"e:{gone}")
    await asyncio.sleep(0.05)
    (lease,) = await q.lease(1, 30_000)
    assert lease.id == gone
    allocation = (0.0, 0.0, 13.2, 0.0, 0.0, 0.0, *multiplier_range(60, 3600))
    end = Revisit(lease.id, lease.token, -1, lease.payload, b"gone", "left", 0, "60", allocation)
    assert (await revisit(q, end)).due == LEFT
    assert not await q.client.hexists(KEYS.revisit_alloc, f"e:{gone}")
    assert await sums(q) == pytest.approx((0.02, 0.02))  # the other URL's alone
    assert await q.client.zscore(KEYS.revisits, gone) is None
    assert await q.client.zscore(KEYS.delayed, gone) is None
    assert not await q.client.hexists(KEYS.payload, gone)
    await q.client.aclose()


def test_a_request_no_rule_matches_any_more_ends_with_a_negative_interval():
    config = RevisitConfig(adaptive=True, rules=((re.compile("/kept"), 100.0),))
    revisits = Revisits(config, lambda r: b"fp")
    held = RevisitState(interval=100.0, visits=1).as_meta()
    left = revisits.visit_end(Request("http://a.example/other", meta={REVISIT_STATE: held}))
    assert left is not None and (left.interval, left.found) == (-1.0, "left")
    assert revisits.visit_end(Request("http://a.example/new")) is None  # it held nothing
    fixed = Revisits(RevisitConfig(rules=config.rules), lambda r: b"fp")
    # a fixed revisit leaves too (its plain ack left it in the revisits: a phantom the
    # status counted for a day, QA), one never revisited is acked
    left = fixed.visit_end(Request("http://a.example/other", meta={REVISIT_STATE: held}))
    assert left is not None and (left.interval, left.found, left.allocation) == (-1.0, "left", None)
    assert fixed.visit_end(Request("http://a.example/new")) is None


@pytest.mark.parametrize("how", ["poison", "corrupt"])
@deferred_f_from_coro_f
async def test_a_revisit_reclaim_dead_letters_leaves_the_budget_and_a_requeue_brings_it_back(
    redis_url, how
):
    """reclaim.lua dead-letters an entry whose worker died running it (poison) or whose
    lease record cannot be read (corrupt). Before, it kept the entry's share in the sums:
    counted twice once a copy of its URL claimed it, and for ever if the dead letter was
    purged."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    await scheduled(q, "stays", 50_000)
    gone = await scheduled(q, "gone", 10)
    await asyncio.sleep(0.05)
    (lease,) = await q.lease(1, 20)
    assert lease.id == gone
    pair = (lease.id, lease.token)
    if how == "poison":  # handed to its engine, then its worker dies: never renewed again
        await q.renew([pair], handed=[pair], worker="w", lease_ms=20, heartbeat_ms=1000)
    else:
        await q.client.hset(KEYS.leases, gone, "garbage")
    await asyncio.sleep(0.05)
    reclaimed = await q.reclaim(worker="w", interval_ms=1, batch=10, max_expiries=1)
    assert reclaimed is not None
    assert (reclaimed.poison, reclaimed.set_aside) == (([gone], 0) if how == "poison" else ([], 1))
    assert await sums(q) == pytest.approx((0.02, 0.02))  # the other URL's alone
    record = json.loads(await q.client.hget(KEYS.dead_info, gone))
    assert (record["class"], record["revisit"]) == (how, pytest.approx([100.0, 0.02]))
    assert await q.requeue_dead([(gone, 0, lease.payload)]) == 1
    assert await sums(q) == pytest.approx((100.02, 0.04))  # back, as if it had not left
    await q.client.aclose()


@pytest.mark.parametrize("record", ["pruned", "older"])
@deferred_f_from_coro_f
async def test_a_requeue_puts_an_adaptive_entry_back_in_the_revisits_by_its_record(
    redis_url, record
):
    """The dead letter's ``revisits`` flag decides: an entry already pruned from the set
    (more than a day past its due time) when it was dead-lettered stays out of it at the
    requeue; a record written before the flag existed puts an adaptive entry back (its share
    of the budget says it was one of the revisits)."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    gone = await scheduled(q, "gone", 10)
    await asyncio.sleep(0.05)
    (lease,) = await q.lease(1, 30_000)
    if record == "pruned":  # as revisit_due prunes one a day past its due time
        await q.client.zrem(KEYS.revisits, gone)
    info = {"class": "gone", "reason": "HTTP 404"}
    assert await q.dead_letter(lease.id, lease.token, info, payload=lease.payload) == 1
    kept = json.loads(await q.client.hget(KEYS.dead_info, gone))
    assert kept["revisits"] is (record == "older")
    if record == "older":
        del kept["revisits"]
        await q.client.hset(KEYS.dead_info, gone, json.dumps(kept))
    assert await q.requeue_dead([(gone, 0, lease.payload)]) == 1
    rejoined = await q.client.zscore(KEYS.revisits, gone) is not None
    assert rejoined is (record == "older")
    await q.client.aclose()


@pytest.mark.parametrize("rules", [{"/other$": 60}, {}], ids=["narrowed", "emptied"])
def test_a_page_revisited_before_leaves_when_no_rule_is_left_too(rules):
    """Review: with ``HA_REVISIT`` emptied (the usual way to stop revisiting), a page that
    was revisited ended as a plain ack: no rule meant its end was never looked at, and its
    entry stayed in the revisits. Narrowed, it left."""
    from scrapy import Spider  # noqa: PLC0415
    from scrapy.utils.test import get_crawler  # noqa: PLC0415

    from scrapy_ha.config.scheduler import SchedulerConfig  # noqa: PLC0415
    from scrapy_ha.scheduler.inflight import InFlight  # noqa: PLC0415
    from scrapy_ha.scheduler.outbox import Outbox  # noqa: PLC0415

    crawler = get_crawler(Spider, {"HA_REVISIT": rules})
    crawler.stats.open_spider()
    outbox = Outbox()
    inflight = InFlight(crawler, outbox, SchedulerConfig.from_settings(crawler.settings))
    held = RevisitState(interval=60.0, visits=3).as_meta()
    inflight._finished("7", "t", Request("http://a.example/page", meta={REVISIT_STATE: held}))
    assert outbox.acks == [] and [(e.kind, e.entry_id) for e in outbox.ends] == [("revisit", "7")]
    assert outbox.ends[0].visit is not None and outbox.ends[0].visit.found == "left"
    inflight._finished("8", "t", Request("http://a.example/new"))  # never revisited: an ack
    assert outbox.acks == [("8", "t")]


@pytest.mark.parametrize("adaptive", [False, True])
@deferred_f_from_coro_f
async def test_a_revisit_whose_ha_revisit_is_refused_now_leaves_the_revisits(redis_url, adaptive):
    """A revisited request whose ``meta["ha_revisit"]`` this version refuses (0.5: an
    earlier version took it and stored it) is not revisited: its entry leaves the revisits
    and, adaptive, the budget's sums, with its lease, as one no rule matches any more.
    Before, it ended as a plain ack: left in ``ha:{S}:revisits``, which ``status`` and the
    metrics counted as a revisited URL due for a day, and its load in the sums for ever."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    stats = MemoryStatsCollector(get_crawler())
    revisits = Revisits(RevisitConfig(adaptive=adaptive, minimum=60), lambda r: b"fp")
    await q.enqueue([NewEntry(b"x", 0, b'{"v":1,"u":"http://a.example/x"}')])
    request = Request("http://a.example/x", meta={"ha_revisit": 60})

    async def finish() -> None:  # as the worker ends a finished request's lease
        (lease,) = await q.lease(1, 30_000)
        visit = revisits.visit_end(request)
        if visit is None:
            await q.sync(ack=[(lease.id, lease.token)])
            return
        op = EndOp("revisit", lease.id, lease.token, request, visit.interval, visit=visit)
        await end_revisit(q, None, op, stats)

    await finish()  # its first visit
    (entry,) = await q.client.zrange(KEYS.revisits, 0, -1)
    assert await q.client.zadd(KEYS.delayed, {entry: 0}, xx=True) == 0  # due now
    request.meta["ha_revisit"] = 0.5  # as an earlier version stored it
    await finish()
    assert await q.client.zcard(KEYS.revisits) == 0
    assert await q.client.zcard(KEYS.delayed) == 0
    assert not await q.client.hexists(KEYS.revisit_alloc, f"e:{entry.decode()}")
    if adaptive:
        assert (await sums(q))[0] == pytest.approx(0.0, abs=1e-6)
    assert stats.get_value("ha/revisit/left") == 1
    await q.client.aclose()
