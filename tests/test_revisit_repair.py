"""A revisit never ends half way on data it reads (lua/revisit.lua, lua/lib/revisit.lua):
garbage in the budget's hash (``ha:{S}:revisit_alloc``) is repaired, a stored state with a
number that is not finite starts afresh, and a non-finite number sent to Redis is refused
before anything changed. Half way meant a lease ended with its domain's concurrency slot
freed in the script's memory and never counted back: the domain blocked for good. Against
a real Redis, with ``HA_DOMAIN_CONCURRENCY = 1`` so that a leaked slot shows."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
import redis.asyncio
from scrapy import Request
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha import metakeys
from scrapy_ha.config.continuous import RevisitConfig, RevisitState
from scrapy_ha.config.politeness import DomainLimit, Politeness
from scrapy_ha.config.scheduler import DeadLetterConfig
from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.outbox import EndOp
from scrapy_ha.scheduler.revisits import Revisits
from scrapy_ha.scheduler.session.ends import Ends
from scrapy_ha.scheduler.session.revisit import _allocation
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.revisits import Revisit, revisit
from scrapy_ha.store.state import set_domain_limits
from scrapy_ha.store.wire import NewEntry

KEYS = Keys("ha", "s")
CONFIG = RevisitConfig(adaptive=True, minimum=6.25, maximum=800.0)


async def one_slot_domain(redis_url: str, pages: int = 3) -> RedisQueue:
    """A queue of *pages* pages of a.test, a domain of one concurrent request."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    limits = Politeness(DomainLimit(concurrency=1), {}).as_hash()
    await set_domain_limits(q.client, KEYS, limits)
    url = b'{"v":1,"u":"http://a.test/%d"}'
    await q.enqueue([NewEntry(b"p%d" % n, 0, url % n) for n in range(pages)])
    return q


def adaptive_end(lease: Any, meta: dict[str, Any] | None = None, ms: int = 50_000) -> Revisit:
    """The end of *lease*'s visit as an adaptive revisit, as a worker computes it."""
    request = Request(f"http://a.test/{lease.id}", meta={metakeys.REVISIT: 50, **(meta or {})})
    visit = Revisits(CONFIG, lambda r: b"").visit_end(request)
    assert visit is not None
    allocation = _allocation(visit)
    return Revisit(lease.id, lease.token, ms, lease.payload, b"", "new", 0, "60", allocation)


async def next_of_domain(q: RedisQueue) -> list[Any]:
    """What a lease of the domain gets now: its next page, if its one slot is free."""
    return await q.lease(1, 30_000)


@deferred_f_from_coro_f
async def test_garbage_in_the_budget_is_repaired_and_the_slot_comes_back(redis_url):
    q = await one_slot_domain(redis_url)
    (lease,) = await q.lease(1, 30_000)
    await q.client.hset(KEYS.revisit_alloc, mapping={"load": "not-a-number", "mu": "nan"})
    end = adaptive_end(lease)
    done = await revisit(q, end)
    assert done.due > 0 and done.multiplier > 0
    alloc = await q.client.hgetall(KEYS.revisit_alloc)
    assert float(alloc[b"load"]) == pytest.approx(end.allocation[0])  # garbage counted as 0
    assert float(alloc[b"mu"]) > 0
    assert await q.client.hget(KEYS.stats, "revisit_repaired") == b"2"  # load and mu
    assert len(await next_of_domain(q)) == 1  # the revisit gave the domain's slot back
    await q.client.aclose()


def held_sums(alloc: dict[bytes, bytes]) -> tuple[float, float]:
    """The sums of what every adaptive entry holds (its ``e:<id>`` field)."""
    held = [v.split() for k, v in alloc.items() if k.startswith(b"e:")]
    return sum(float(load) for load, _ in held), sum(float(base) for _, base in held)


@deferred_f_from_coro_f
async def test_a_sum_that_holds_garbage_is_made_again_from_what_the_entries_hold(redis_url):
    """A sum of the budget with garbage counted as 0 and went on from there: the load of
    every other revisited URL left out for good (a crawl's load went negative as entries
    left, and its intervals grew to HA_REVISIT_MAX). It is the sum of what the entries
    hold, as when nothing went wrong."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    url = b'{"v":1,"u":"http://a.test/%d"}'
    await q.enqueue([NewEntry(b"p%d" % n, 0, url % n) for n in range(3)])
    for lease in await q.lease(3, 30_000):
        assert (await revisit(q, adaptive_end(lease, ms=1))).due > 0
    await asyncio.sleep(0.01)
    lease = (await q.lease(1, 30_000))[0]
    await q.client.hset(KEYS.revisit_alloc, mapping={"load": "garbage", "base": "nan"})
    before = await q.client.hgetall(KEYS.revisit_alloc)
    load, base = held_sums(before)  # 3 entries' shares
    own_load, own_base = map(float, before[b"e:" + lease.id.encode()].split())
    end = adaptive_end(lease)
    assert end.allocation is not None and (await revisit(q, end)).due > 0
    alloc = await q.client.hgetall(KEYS.revisit_alloc)
    # its own share (its record) replaced by what this visit says it holds now
    assert float(alloc[b"load"]) == pytest.approx(load - own_load + end.allocation[0])
    assert float(alloc[b"base"]) == pytest.approx(base - own_base + end.allocation[1])
    assert await q.client.hget(KEYS.stats, "revisit_repaired") == b"2"
    assert await q.dead_letter(lease.id, lease.token, {"class": "gone"}) == 0  # (acked)
    (again,) = await q.lease(1, 30_000)
    await q.client.hset(KEYS.revisit_alloc, "load", "garbage")
    assert await q.dead_letter(again.id, again.token, {"class": "gone"}) == 1
    alloc = await q.client.hgetall(KEYS.revisit_alloc)
    assert float(alloc[b"load"]) == pytest.approx(held_sums(alloc)[0])  # its share out once
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_dead_letter_with_garbage_in_the_budget_gives_the_slot_back(redis_url):
    q = await one_slot_domain(redis_url, pages=1)
    (lease,) = await q.lease(1, 30_000)
    assert (await revisit(q, adaptive_end(lease, ms=1))).due > 0  # due again at once
    await q.client.hset(KEYS.revisit_alloc, "base", "garbage")
    await asyncio.sleep(0.01)
    (again,) = await q.lease(1, 30_000)
    assert again.id == lease.id
    assert await q.dead_letter(again.id, again.token, {"class": "gone"}) == 1
    assert await q.client.hget(KEYS.stats, "revisit_repaired") == b"1"
    await q.enqueue([NewEntry(b"p9", 0, b'{"v":1,"u":"http://a.test/9"}')])
    assert len(await next_of_domain(q)) == 1
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_stored_state_with_a_nan_starts_afresh(redis_url):
    assert RevisitState.from_meta({"i": "nan", "n": 3}) == RevisitState()
    assert RevisitState.from_meta({"i": 50, "u": "inf"}) == RevisitState()
    assert RevisitState.from_meta({"i": 50, "b": float("inf")}) == RevisitState()
    q = await one_slot_domain(redis_url)
    (lease,) = await q.lease(1, 30_000)
    state = {metakeys.REVISIT_STATE: {"i": "nan", "n": 3, "c": 1}}
    assert (await revisit(q, adaptive_end(lease, state))).due > 0
    assert len(await next_of_domain(q)) == 1
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_non_finite_number_is_refused_before_any_write(redis_url):
    q = await one_slot_domain(redis_url)
    (lease,) = await q.lease(1, 30_000)
    end = adaptive_end(lease)
    assert end.allocation is not None
    for bad in (float("nan"), float("inf")):
        wrong = Revisit(*end.__dict__.values())
        object.__setattr__(wrong, "allocation", (bad, *end.allocation[1:]))
        with pytest.raises(redis.exceptions.ResponseError, match="finite"):
            await revisit(q, wrong)
    assert await q.client.zscore(KEYS.leased, lease.id) is not None  # still held, intact
    assert not await q.client.exists(KEYS.revisit_alloc)
    assert await q.client.hget(KEYS.polite, "n:a.test") == b"1"  # its slot is still its own
    assert (await revisit(q, end)).due > 0  # and its right end gives it back
    assert len(await next_of_domain(q)) == 1
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_failed_end_whose_lease_had_ended_is_a_warning(redis_url, caplog):
    # the dead letter a worker falls back on when ending a request failed is fenced too:
    # refused when the lease had ended meanwhile (expired, or ended by the failed attempt)
    q = await one_slot_domain(redis_url, pages=1)
    (lease,) = await q.lease(1, 30_000)
    ends = Ends(get_crawler().stats, DeadLetterConfig())
    ends.queue = q
    unstorable = Request("http://a.test/0", meta={"x": object()})  # its retry cannot be stored
    caplog.set_level(logging.WARNING)
    await ends.end_ops([EndOp("retry", lease.id, "stale", unstorable)], 1)
    (record,) = [r for r in caplog.records if r.name == "scrapy_ha.scheduler.session.ends"]
    assert record.levelno == logging.WARNING
    assert "nor dead-letter it: its lease had ended" in record.getMessage()
    assert await q.client.zscore(KEYS.leased, lease.id) is not None  # untouched
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_revisit_wakes_the_domain_s_waiting_queue(redis_url):
    # the domain's next page waits for its one slot (its back queue parked, rechecked at
    # most a second later): the end of the lease holding it wakes the queue at once, as
    # an ack does; a revisit did not (a continuous crawl of one domain waited ~1 s a page)
    q = await one_slot_domain(redis_url)
    (lease,) = await q.lease(1, 30_000)
    for end in ("revisit", "ack"):
        assert await next_of_domain(q) == []  # parked: the slot is taken
        if end == "revisit":
            assert (await revisit(q, adaptive_end(lease))).due > 0
        else:
            await q.ack([(lease.id, lease.token)])
        (lease,) = await next_of_domain(q)  # at once, not a second later
    await q.client.aclose()
