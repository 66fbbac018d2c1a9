"""Adaptive revisits (``HA_REVISIT_ADAPTIVE``): each page's change rate estimated from its
visits, its interval the freshness-optimal one at the crawl's multiplier, and the
multiplier nudged in Redis until the intervals spend the budget
(scrapy_ha/config/freshness.py, scheduler/revisits.py, lua/lib/revisit.lua)."""

from __future__ import annotations

import asyncio
import math
import random

import pytest
import redis.asyncio
from scrapy import Request
from scrapy.http import HtmlResponse
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha import metakeys
from scrapy_ha.config.continuous import FIRST_MULTIPLIER, RevisitConfig, RevisitState
from scrapy_ha.config.freshness import (
    change_rate,
    cho_estimate,
    expected_interval,
    freshness,
    marginal_gain,
    multiplier_range,
    optimal_interval,
    posterior,
)
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.keys import Keys
from scrapy_ha.middlewares.revisit import page_age
from scrapy_ha.scheduler.revisits import Revisits
from scrapy_ha.scheduler.session.revisit import _allocation
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.revisits import DOUBLE, Revisit, revisit
from scrapy_ha.store.wire import NewEntry

KEYS = Keys("ha", "s")
LOW, HIGH = 6.25, 800.0  # the freshness benchmark's bounds


def observed(rate: float, interval: float, visits: int, seed: int = 7) -> int:
    """Changes seen over *visits* visits every *interval* of a Poisson page of *rate*."""
    rng = random.Random(seed)
    return sum(rng.random() < -math.expm1(-rate * interval) for _ in range(visits))


@pytest.mark.parametrize("rate", [0.002, 0.01, 0.05])
def test_the_change_rate_from_many_visits_is_the_page_s_and_cho_s(rate):
    visits, interval = 4000, 20.0
    changes = observed(rate, interval, visits)
    estimate = change_rate(changes, changes * interval, (visits - changes) * interval, LOW, HIGH)
    assert estimate == pytest.approx(rate, rel=0.1)
    assert estimate == pytest.approx(cho_estimate(visits, changes, interval), rel=0.05)


def test_a_page_changed_at_every_visit_is_faster_than_cho_s_bound():
    # Cho's estimator cannot say more than ln(2n + 1) / I for X = n; the posterior says
    # the page is faster than the visits could see (to be given up, not chased)
    for n in (1, 3, 6):
        assert change_rate(n, n * 50, 0, LOW, HIGH) > 2 * cho_estimate(n, n, 50)
    assert change_rate(6, 300, 0, LOW, HIGH) > change_rate(2, 100, 0, LOW, HIGH)
    # changes within short intervals say more than changes within long ones
    assert change_rate(2, 10, 0, LOW, HIGH) > change_rate(2, 100, 0, LOW, HIGH)


def test_intervals_of_any_length_count():
    # a page found unchanged for 1,000 s in all, changed twice within 20 s intervals
    mixed = change_rate(2, 40, 1000, LOW, HIGH)
    assert mixed == pytest.approx(cho_estimate(52, 2, 20), rel=0.35)
    assert change_rate(2, 40, 2000, LOW, HIGH) < mixed


def test_a_page_never_found_changed_slows_step_by_step():
    rates = [change_rate(0, 0, n * 50, LOW, HIGH) for n in (1, 2, 4, 8)]
    assert rates == sorted(rates, reverse=True)
    assert rates[0] > 1 / HIGH  # not at once the slowest rate there is
    config = RevisitConfig(adaptive=True, minimum=LOW, maximum=HIGH)
    intervals = [
        config.next_interval(50, RevisitState(unchanged_for=n * 50), 13.2) for n in (1, 2, 4)
    ]
    assert intervals == sorted(intervals) and intervals[0] < HIGH


def test_freshness_is_cho_s():
    assert freshness(0.01, 100) == pytest.approx((1 - math.exp(-1)) / 1)
    assert freshness(0, 100) == 1.0
    assert freshness(1, 1e6) == pytest.approx(1e-6)


def test_every_page_gains_the_multiplier_from_one_more_visit_a_second():
    mu = 5.6
    for rate in (0.003, 0.01, 0.05, 0.15):
        interval = optimal_interval(rate, mu, 0.001, 1e6)
        # d freshness / d (1 / interval) = g(rate * interval) / rate
        assert marginal_gain(rate * interval) / rate == pytest.approx(mu, rel=1e-6)
    # slow pages wait longer than faster ones; one faster than 1 / mu is given up
    assert optimal_interval(0.003, mu, LOW, HIGH) > optimal_interval(0.05, mu, LOW, HIGH)
    assert optimal_interval(0.2, mu, LOW, HIGH) == HIGH
    assert optimal_interval(0.0, mu, LOW, HIGH) == HIGH
    assert optimal_interval(0.001, 1e-9, LOW, HIGH) == LOW


def allocate(rates: list[float], budget: float) -> list[float]:
    """The optimal intervals of *rates* whose 1 / interval sum to *budget*."""
    lo, hi = 1e-3, 1e3
    for _ in range(60):
        mu = math.sqrt(lo * hi)
        load = sum(1 / optimal_interval(r, mu, LOW, HIGH) for r in rates)
        lo, hi = (mu, hi) if load > budget else (lo, mu)
    return [optimal_interval(r, mu, LOW, HIGH) for r in rates]


def test_the_allocation_beats_a_fixed_interval_at_the_same_budget():
    # the freshness benchmark's site: 1,000 rates log-uniform from 1/300 to 4.8 a second,
    # 20 visits a second (a fixed interval of 50 s)
    rng = random.Random(1)
    rates = [
        288 * math.exp(rng.uniform(math.log(1 / 86400), math.log(1 / 60))) for _ in range(1000)
    ]
    intervals = allocate(rates, 20.0)
    assert sum(1 / i for i in intervals) == pytest.approx(20.0, rel=1e-3)
    fixed = sum(freshness(r, 50.0) for r in rates)
    adaptive = sum(freshness(r, i) for r, i in zip(rates, intervals, strict=True))
    assert adaptive / fixed > 1.15  # 1.19: Cho and Garcia-Molina's optimum here
    given_up = [r for r, i in zip(rates, intervals, strict=True) if i == HIGH]
    assert given_up and min(given_up) > 0.1  # the fastest pages, and those alone


def test_with_a_sure_rate_the_expected_interval_is_the_optimal_one():
    changes = observed(0.02, 20, 4000)
    post = posterior(changes, changes * 20, (4000 - changes) * 20, LOW, HIGH)
    assert expected_interval(post, 5.6, LOW, HIGH) == pytest.approx(
        optimal_interval(0.02, 5.6, LOW, HIGH), rel=0.1
    )


def test_next_interval_fixed_and_adaptive():
    fixed = RevisitConfig()
    assert fixed.next_interval(50, RevisitState(changed=9, changed_for=450), 5.6) == 50
    config = RevisitConfig(adaptive=True, minimum=LOW, maximum=HIGH)
    slow = RevisitState(changed=1, changed_for=50, unchanged_for=950)
    medium = RevisitState(changed=8, changed_for=400, unchanged_for=600)
    fast = RevisitState(changed=20, changed_for=1000)
    assert config.next_interval(50, slow, 5.6) > config.next_interval(50, medium, 5.6)
    assert config.next_interval(50, fast, 5.6) == HIGH
    assert LOW <= config.next_interval(50, RevisitState(), 5.6) <= HIGH
    # a larger multiplier (a budget spent) lengthens every interval
    assert config.next_interval(50, medium, 20) > config.next_interval(50, medium, 5.6)


def test_the_budget_setting_is_validated():
    assert RevisitConfig.from_settings(Settings({"HA_REVISIT_BUDGET": "12.5"})).budget == 12.5
    assert RevisitConfig.from_settings(Settings()).budget == 0
    with pytest.raises(ConfigError, match="HA_REVISIT_BUDGET"):
        RevisitConfig.from_settings(Settings({"HA_REVISIT_BUDGET": -1}))


def test_the_visits_evidence_travels_in_the_request_s_meta():
    now = [1000.0]
    config = RevisitConfig(rules=(), adaptive=True, minimum=LOW, maximum=HIGH)
    revisits = Revisits(config, lambda r: b"fp", clock=lambda: now[0])
    request = Request("http://a.example/p/1", meta={metakeys.REVISIT: 50})
    first = revisits.visit_end(request)
    assert first is not None and first.load is not None
    assert first.load.base == pytest.approx(1 / 50)  # counted once, at the first visit
    assert first.load.first_multiplier == pytest.approx(FIRST_MULTIPLIER * 50)
    for found, at in (("changed", 1040.0), ("not_modified", 1100.0), ("unchanged", 1130.0)):
        now[0] = at
        request.meta[metakeys.REVISIT_SEEN] = (found, RevisitState())
        end = revisits.visit_end(request)
        assert end is not None and end.load is not None and end.load.base == 0
    state = RevisitState.from_meta(request.meta[metakeys.REVISIT_STATE])
    assert (state.changed, state.changed_for, state.unchanged_for) == (1, 40.0, 90.0)
    assert state.last == 1130.0
    assert state.interval == pytest.approx(end.interval, abs=0.001)  # stored to the ms


async def sums(client) -> dict[str, float]:
    """The budget's sums and multiplier (``ha:{S}:revisit_alloc``; its ``e:<id>`` fields say
    what each entry holds in them)."""
    raw = await client.hgetall(KEYS.revisit_alloc)
    return {k.decode(): float(v) for k, v in raw.items() if not k.startswith(b"e:")}


async def _visit(q: RedisQueue, name: str, load: float, budget: float) -> float:
    await q.enqueue(
        [NewEntry(name.encode(), 0, b'{"v":1,"u":"http://a.example/' + name.encode() + b'"}')]
    )
    (lease,) = await q.lease(1, 30_000)
    allocation = (load, 1 / 50, budget, 13.2, 0.0, 0.0, *multiplier_range(LOW, HIGH))
    end = Revisit(
        lease.id, lease.token, 50_000, lease.payload, name.encode(), "new", 0, "60", allocation
    )
    return (await revisit(q, end)).multiplier


@deferred_f_from_coro_f
async def test_redis_nudges_the_multiplier_until_the_load_is_the_budget(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    client = q.client
    over = [await _visit(q, f"a{i}", 1 / 10, 0) for i in range(5)]  # 0.5/s against 0.1/s
    assert over == sorted(over) and over[0] > 13.2  # the intervals are too short: it grows
    alloc = await sums(client)
    assert alloc["load"] == pytest.approx(0.5) and alloc["base"] == pytest.approx(0.1)
    under = [await _visit(q, f"b{i}", -1 / 10 + 1 / 1000, 10.0) for i in range(4)]
    assert under == sorted(under, reverse=True) and under[-1] < over[-1]  # under 10/s: shrinks
    await client.aclose()


@deferred_f_from_coro_f
async def test_fixed_revisits_keep_no_budget(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    await q.enqueue([NewEntry(b"x", 0, b'{"v":1,"u":"http://a.example/x"}')])
    (lease,) = await q.lease(1, 30_000)
    done = await revisit(
        q, Revisit(lease.id, lease.token, 50_000, lease.payload, b"x", "new", 0, "60")
    )
    assert done.due > 0 and done.multiplier == 0.0
    assert not await q.client.exists(KEYS.revisit_alloc)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_double_takes_its_load_out_of_the_budget(redis_url):
    # A URL revisited by two entries (a re-seeded start request, say): the first gives way
    # while it is pending more than a day past its due time (out of the revisits set: a
    # pending revisit within the day holds its URL, lib/revisit), the second claims the
    # URL, then the first comes back and ends as a double. The URL must count once in the
    # intervals' load, not its two entries' intervals.
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    config = RevisitConfig(adaptive=True, minimum=LOW, maximum=HIGH)
    revisits = Revisits(config, lambda r: b"fp")
    url = "http://a.example/p/1"

    async def end(lease, request, interval_ms: int) -> int:
        visit = revisits.visit_end(request)
        assert visit is not None
        done = await revisit(
            q,
            Revisit(
                lease.id,
                lease.token,
                interval_ms,
                lease.payload,
                visit.fingerprint,
                visit.found,
                0,
                "60",
                _allocation(visit),
            ),
        )
        return done.due

    first = Request(url, meta={metakeys.REVISIT: 50})
    await q.enqueue([NewEntry(b"e1", 0, b'{"v":1,"u":"' + url.encode() + b'"}')])
    (lease,) = await q.lease(1, 30_000)
    assert await end(lease, first, 1) > 0  # scheduled, due at once
    await asyncio.sleep(0.05)
    (again,) = await q.lease(1, 30_000)
    assert again.id == lease.id
    await q.enqueue([NewEntry(b"e2", 0, b'{"v":1,"u":"' + url.encode() + b'"}')])
    (other,) = await q.lease(1, 30_000)
    assert other.id != lease.id
    assert await q.release([(again.id, again.token)]) == 1  # the first entry is pending
    await q.client.zrem(KEYS.revisits, lease.id)  # as the trim a day past its due time does
    second = Request(url, meta={metakeys.REVISIT: 50})
    assert await end(other, second, 50_000) > 0  # it claims the URL
    (back,) = await q.lease(1, 30_000)
    assert back.id == lease.id
    assert await end(back, first, 50_000) == DOUBLE
    alloc = await sums(q.client)
    state = RevisitState.from_meta(second.meta[metakeys.REVISIT_STATE])
    held = await q.client.hgetall(KEYS.revisit_alloc)
    assert f"e:{other.id}".encode() in held and f"e:{lease.id}".encode() not in held
    assert alloc["load"] == pytest.approx(1 / state.interval, rel=1e-3)
    assert alloc["base"] == pytest.approx(1 / 50)
    await q.client.aclose()


def test_a_page_s_age_is_its_date_less_its_last_modified():
    def answer(**headers: str) -> HtmlResponse:
        return HtmlResponse("http://a.example/p/1", headers=headers, body=b"x")

    date, modified = "Wed, 02 Dec 2026 04:40:56 GMT", "Wed, 02 Dec 2026 04:40:26 GMT"
    assert page_age(answer(Date=date), modified) == 30.0
    assert page_age(answer(), modified) == -1  # no Date: not known
    assert page_age(answer(Date=date), "") == -1  # no Last-Modified
    assert page_age(answer(Date=modified), date) == -1  # modified after its date
    assert page_age(answer(Date="yesterday"), modified) == -1


def test_a_changed_page_s_age_dates_its_change():
    now = [1000.0]
    config = RevisitConfig(rules=(), adaptive=True, minimum=LOW, maximum=HIGH)
    revisits = Revisits(config, lambda r: b"fp", clock=lambda: now[0])
    request = Request("http://a.example/p/1", meta={metakeys.REVISIT: 50})
    visits = (
        ("new", 1000.0, 100.0),  # unchanged for 100 s before the first visit
        ("changed", 1050.0, 20.0),  # changed 20 s ago, within the 50 s since: dated
        ("changed", 1100.0, 80.0),  # "changed" 80 s ago, before the last visit: not dated
        ("changed", 1150.0, -1.0),  # no Last-Modified: the interval's evidence
        ("not_modified", 1200.0, -1.0),
    )
    for found, at, age in visits:
        now[0] = at
        request.meta[metakeys.REVISIT_SEEN] = (found, RevisitState(age=age))
        assert revisits.visit_end(request) is not None
    state = RevisitState.from_meta(request.meta[metakeys.REVISIT_STATE])
    assert state.dated == 1 and state.changed == 2 and state.changed_for == 100.0
    assert state.unchanged_for == 100.0 + 20.0 + 50.0
    assert state.age == -1  # the answer's, not kept


def test_a_few_dated_changes_tell_a_fast_page_from_a_slower_one():
    # two pages found changed at each of 3 visits 50 s apart: the intervals alone cannot
    # tell them apart; their ages (20 s and 2 s each time) can, and the faster one, which
    # changes faster than the budget can follow (rate * multiplier > 1), is given up
    config = RevisitConfig(adaptive=True, minimum=LOW, maximum=HIGH)
    blind = [RevisitState(changed=3, changed_for=150.0) for _ in range(2)]
    assert config.next_interval(50, blind[0], 5.6) == config.next_interval(50, blind[1], 5.6)
    slow, fast = (RevisitState(dated=3, unchanged_for=3 * age) for age in (20.0, 2.0))
    for state, rate in ((slow, 0.05), (fast, 0.5)):
        post = posterior(0, 0, state.unchanged_for, LOW, HIGH, state.dated)
        estimate = math.exp(sum(p * math.log(r) for r, p in post))  # its geometric mean
        assert estimate == pytest.approx(rate, rel=0.4)
    assert config.next_interval(50, slow, 5.6) < HIGH
    assert config.next_interval(50, fast, 5.6) == HIGH


@pytest.mark.parametrize(("low", "high"), [(1.0, 1e16), (60.0, 6e17), (1.0, 1e300)])
def test_the_multiplier_s_range_stays_positive_for_bounds_far_apart(low, high):
    """Bounds 1e16 or more apart made the lowest multiplier 0.0, and Redis refused every
    adaptive revisit of the crawl (a range that must be positive, finite numbers)."""
    lowest, highest = multiplier_range(low, high)
    assert 0 < lowest < highest and math.isfinite(lowest)


def test_the_multiplier_s_range_is_where_it_moves_an_interval():
    lowest, highest = multiplier_range(LOW, HIGH)
    config = RevisitConfig(adaptive=True, minimum=LOW, maximum=HIGH)
    rng = random.Random(3)
    for _ in range(50):  # whatever the visits said: every page at its bounds there
        state = RevisitState(
            changed=rng.randint(0, 20),
            changed_for=rng.uniform(0, 5000),
            unchanged_for=rng.uniform(0, 50000),
            dated=rng.randint(0, 5),
        )
        assert config.next_interval(50, state, highest) == HIGH
        assert config.next_interval(50, state, lowest) == LOW


@deferred_f_from_coro_f
async def test_a_budget_the_bounds_cannot_meet_does_not_wind_the_multiplier_up(redis_url):
    # one URL whose interval cannot grow past HA_REVISIT_MAX against a budget it can never
    # meet: the multiplier grew 10% a revisit, to inf, and never came down (mu * step)
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    request = Request("http://a.example/p", meta={metakeys.REVISIT: 50})
    await q.enqueue([NewEntry(b"p", 0, b'{"v":1,"u":"http://a.example/p"}')])

    async def cycle(budget: float, times: int) -> float:
        config = RevisitConfig(adaptive=True, minimum=LOW, maximum=HIGH, budget=budget)
        revisits = Revisits(config, lambda r: b"")
        mu = 0.0
        for _ in range(times):
            (lease,) = await q.lease(1, 30_000)
            visit = revisits.visit_end(request)
            assert visit is not None
            args = (lease.id, lease.token, 0, lease.payload, b"", visit.found, 0, "60")
            mu = (await revisit(q, Revisit(*args, _allocation(visit)))).multiplier
        return mu

    lowest, highest = multiplier_range(LOW, HIGH)
    assert await cycle(1e-6, 300) == highest  # 13.2 x 1.1^300 before
    assert await cycle(10.0, 60) == pytest.approx(highest * 0.9**60)  # it comes back at once
    assert await cycle(10.0, 1000) == lowest  # and down no further than that
    await q.client.aclose()
