"""Revisits: a finished request goes back to the delayed set, due after its interval, its
attempts reset; one entry revisits a URL; the crawl never finishes by itself and stops
with ``scrapy-ha stop`` (lua/revisit.lua, scheduler/revisits.py, against a real Redis and
the demo site)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import defaultdict
from typing import Any

import pytest
import redis.asyncio
from scrapy import Request
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.config.continuous import RevisitConfig
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.keys import Keys
from scrapy_ha.ops.revisits import read_revisits
from scrapy_ha.scheduler.revisits import Revisits
from scrapy_ha.store.aged import AgedBloom, AgedSet
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.revisits import DOUBLE, Revisit, revisit
from scrapy_ha.store.wire import NewEntry
from tests import backqueues
from tests.cli_seed import scrapy_ha
from tests.spiders import CatalogueSpider

KEYS = Keys("ha", "s")


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


def entry(name: str, fp: bytes = b"") -> NewEntry:
    return NewEntry(fp, 0, b'{"v":1,"u":"http://a.example/' + name.encode() + b'"}')


def name_of(lease: Any) -> str:
    return json.loads(lease.payload)["u"].rsplit("/", 1)[1]


def visit(lease: Any, fp: bytes, *, ms: int = 60_000, found: str = "changed") -> Revisit:
    return Revisit(lease.id, lease.token, ms, lease.payload + b" ", fp, found, 0, "60")


@deferred_f_from_coro_f
async def test_a_revisit_ends_the_lease_in_the_delayed_set_with_its_attempts_reset(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    client = q.client
    await q.enqueue([entry("a", b"fp-a")])
    (lease,) = await q.lease(1, 30_000)
    await client.hset(KEYS.retried, lease.id, 2)  # it had been retried
    await client.hset(KEYS.expiries, lease.id, "1 1")
    due = (await revisit(q, visit(lease, b"fp-a"))).due
    now = (await q.counts()).now_ms
    assert 59_000 < due - now <= 60_000
    assert await client.zscore(KEYS.delayed, lease.id) == due
    assert await client.hget(KEYS.payload, lease.id) == lease.payload + b" "
    assert not await client.hexists(KEYS.expiries, lease.id)  # poison counting starts again
    assert not await client.hexists(KEYS.retried, lease.id)
    stats = await client.hgetall(KEYS.stats)
    assert stats[b"acked"] == stats[b"retry_ok"] == stats[b"revisited:changed"] == b"1"
    assert (await revisit(q, visit(lease, b"fp-a"))).due == 0  # its lease ended: stale
    numbers = await read_revisits(client, KEYS, now)
    assert (numbers.revisited, numbers.due_soon, numbers.found) == (1, 1, {"changed": 1})
    await client.aclose()


@deferred_f_from_coro_f
async def test_one_entry_revisits_a_url(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    client = q.client
    await q.enqueue([entry("a"), entry("b")])  # two copies of one URL (never filtered)
    first, second = await q.lease(2, 30_000)
    assert (await revisit(q, visit(first, b"fp", ms=0))).due > 0
    assert (await revisit(q, visit(second, b"fp"))).due == DOUBLE  # first waits in the delayed set
    assert await client.zcard(KEYS.delayed) == 1
    assert not await client.hexists(KEYS.payload, second.id)
    assert (await client.hgetall(KEYS.stats))[b"revisit_double"] == b"1"
    # first is due at once: promoted, it is pending (not leased, not delayed): a third copy
    # that ends meanwhile is a double too (before, it took over, and first, with its
    # history, ended as the double when it finished)
    await q.enqueue([NewEntry(b"", 1, entry("c").payload)])  # goes first: priority 1
    (third,) = await q.lease(1, 30_000)  # first is promoted, and left pending
    assert third.payload.endswith(b'/c"}')
    assert (await revisit(q, visit(third, b"fp"))).due == DOUBLE
    (again,) = await q.lease(1, 30_000)
    assert again.id == first.id
    assert (await revisit(q, visit(again, b"fp"))).due > 0
    assert await client.zrange(KEYS.delayed, 0, -1) == [first.id.encode()]
    await client.aclose()


@pytest.mark.parametrize("kind", ["set", "bloom"])
@deferred_f_from_coro_f
async def test_a_revisited_url_stays_seen_with_a_ttl(redis_url, kind):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    q.dupefilter = AgedSet(1000) if kind == "set" else AgedBloom(1000, 1e-3, 1000)
    fp = hashlib.sha1(b"a").digest()[:16]  # noqa: S324
    await q.enqueue([entry("a", fp)])
    (lease,) = await q.lease(1, 30_000)
    await asyncio.sleep(1.3)  # the enqueue is older than the TTL and its slice
    assert (await revisit(q, visit(lease, fp))).due > 0
    assert await q.enqueue([entry("a", fp)]) == 0  # a link to it: seen (the revisit)
    await q.client.aclose()


@pytest.mark.parametrize(
    ("settings", "url", "meta", "expected"),
    [
        ({}, "http://a/x", {}, None),
        ({}, "http://a/x", {"ha_revisit": 30}, 30.0),
        ({"HA_REVISIT": {r"/x$": 60, r"/": 600}}, "http://a/x", {}, 60.0),
        ({"HA_REVISIT": {r"/x$": 60, r"/": 600}}, "http://a/y", {}, 600.0),
        ({"HA_REVISIT": {r"/": 600}}, "http://a/y", {"ha_revisit": 0}, None),  # opted out
        ({"HA_REVISIT": {r"/": 600}}, "http://a/y", {"ha_revisit": 5}, 5.0),
    ],
)
def test_which_requests_are_revisited_and_how_often(settings, url, meta, expected):
    config = RevisitConfig.from_settings(Settings(settings))
    assert config.interval_for(url, meta) == expected


@pytest.mark.parametrize("value", [float("inf"), "nan", "-inf", 0.01, 0.999, 1.7e308, 2e12])
def test_a_request_whose_ha_revisit_is_out_of_bounds_is_not_revisited(value, caplog):
    config = RevisitConfig.from_settings(Settings({"HA_REVISIT_ADAPTIVE": True}))
    with pytest.raises(ConfigError, match="meta\\['ha_revisit'\\]=.* must be seconds"):
        config.interval_for("http://a/x", {"ha_revisit": value})
    revisits = Revisits(config, lambda r: b"")
    assert revisits.visit_end(Request("http://a/x", meta={"ha_revisit": value})) is None


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"HA_REVISIT": {"(": 60}}, r"HA_REVISIT\['\('\] is not a regular expression"),
        ({"HA_REVISIT": {"/": 0}}, r"HA_REVISIT\['/'\]=0 must be seconds"),
        ({"HA_REVISIT_MIN": 600, "HA_REVISIT_MAX": 60}, "HA_REVISIT_MIN=600 must not be longer"),
        # not finite: HA_REVISIT_MAX = inf divided by zero in every revisit's end
        ({"HA_REVISIT": {"/": "inf"}}, r"HA_REVISIT\['/'\]='inf' must be seconds, a finite"),
        ({"HA_REVISIT": {"/": float("nan")}}, r"HA_REVISIT\['/'\]=nan must be seconds"),
        ({"HA_REVISIT_MAX": float("inf")}, "HA_REVISIT_MAX=inf must be a finite number"),
        ({"HA_REVISIT_MAX": "nan"}, "HA_REVISIT_MAX='nan' is not a number \\(NaN\\)"),
        ({"HA_REVISIT_MIN": "nan"}, "HA_REVISIT_MIN='nan' is not a number \\(NaN\\)"),
        ({"HA_REVISIT_BUDGET": "nan"}, "HA_REVISIT_BUDGET='nan' is not a number \\(NaN\\)"),
        # under a second: a page fetched in a loop; past 1e10 s: 1.7e308 overflowed the
        # adaptive sums (ZeroDivisionError at every revisit's end)
        ({"HA_REVISIT": {"/": 0.2}}, r"HA_REVISIT\['/'\]=0.2 must be seconds, .* from 1 to 1e\+10"),
        ({"HA_REVISIT_MIN": 0.5}, r"HA_REVISIT_MIN=0.5 must be seconds, .* from 1 to 1e\+10"),
        # 0 said "must be more than 0 seconds", which 0.5 is and is refused all the same
        ({"HA_REVISIT_MIN": 0}, r"HA_REVISIT_MIN=0.0 must be seconds, .* from 1 to 1e\+10"),
        ({"HA_REVISIT_MAX": 1.7e308}, r"HA_REVISIT_MAX=1.7e\+308 must be seconds, .* from 1"),
        ({"HA_REVISIT_MAX": 2e12}, r"HA_REVISIT_MAX=2000000000000.0 must be seconds"),
        # due in the year 33,715, which the tools showed as 9999-12-30 (a QA run)
        (
            {"HA_REVISIT": {"/": 1e12}},
            r"HA_REVISIT\['/'\]=1000000000000.0 must be seconds, .* to 1e\+10",
        ),
    ],
)
def test_a_bad_revisit_setting_names_it(settings, message):
    with pytest.raises(ConfigError, match=message):
        RevisitConfig.from_settings(Settings(settings))


def visits(site) -> dict[str, list[float]]:
    times: dict[str, list[float]] = defaultdict(list)
    for t, path, *_ in site.log():
        times[path].append(t)
    return times


CONTINUOUS = {
    "ADDONS": {"scrapy_ha.Addon": 0},
    "HA_IDLE_TIMEOUT": 0.3,
    "HA_LEASE_TIME": 3,
    "HA_LEASE_RENEW_INTERVAL": 0.5,
    "HA_HEARTBEAT_TTL": 3,
    "LOG_LEVEL": "INFO",
}


@deferred_f_from_coro_f
async def test_a_revisited_start_page_makes_a_crawl_that_runs_until_stopped(
    redis_url, site, redis_client
):
    interval = 1.0
    settings = {**CONTINUOUS, "REDIS_URL": redis_url, "HA_REVISIT": {r"/list/1$": interval}}
    crawler = get_crawler(CatalogueSpider, settings)
    crawling = asyncio.ensure_future(crawler.crawl_async(base_url=site.url))
    deadline = time.monotonic() + 60
    while len(visits(site)["/list/1"]) < 4:
        assert not crawling.done(), "the crawl finished by itself"
        assert time.monotonic() < deadline, visits(site)
        await asyncio.sleep(0.2)
    stopped = await asyncio.to_thread(scrapy_ha, "stop", "catalogue", "--redis-url", redis_url)
    assert stopped.returncode == 0, stopped.stderr
    await asyncio.wait_for(crawling, 30)
    assert crawler.stats.get_value("finish_reason") == "stopped"
    times = visits(site)
    starts = times.pop("/list/1")
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert min(gaps) >= interval * 0.9, gaps  # never sooner than its interval: no double
    assert max(len(t) for t in times.values()) == 1  # its links were seen: crawled once
    assert crawler.stats.get_value("ha/revisit/scheduled") >= 3
    # each visit's ack is counted for its domain too (status and the dashboard by domain)
    acked = int(await asyncio.to_thread(redis_client.hget, "ha:{catalogue}:stats", "acked"))
    by_domain = await asyncio.to_thread(
        redis_client.hget, "ha:{catalogue}:stats:domain", "127.0.0.1\tacked"
    )
    assert int(by_domain or 0) == acked, (by_domain, acked)
    # the crawl stays in Redis with its revisit (waiting, or given back pending if the stop
    # came during a visit): a worker started now resumes it
    keys = Keys("ha", "catalogue")
    waiting = [
        await asyncio.to_thread(redis_client.zcard, keys.delayed),
        await asyncio.to_thread(backqueues.count, redis_client, keys),
    ]
    assert sum(waiting) == 1 and not await asyncio.to_thread(redis_client.zcard, keys.leased)
    check = ("seen", "check", "catalogue", f"{site.url}/list/1", "--redis-url", redis_url)
    checked = await asyncio.to_thread(scrapy_ha, *check)
    assert checked.returncode == 0, checked.stderr  # a revisited URL stays seen
    assert "seen (kept for ever); revisited (entry " in checked.stdout
    (entry,) = await asyncio.to_thread(redis_client.zrange, keys.revisits, 0, -1)
    await asyncio.to_thread(redis_client.zadd, keys.revisits, {entry: 10**12})  # 2001: past
    checked = await asyncio.to_thread(scrapy_ha, *check)  # (not "next visit" in the past)
    assert ", due since 2001-09-" in checked.stdout and "next visit" not in checked.stdout
    # a worker started after the stop resumes the crawl and says when (an items consumer's
    # --exit-idle waits for a stopped crawl only: sinks/consumer.py)
    assert not await asyncio.to_thread(redis_client.hexists, keys.run, "resumed")
    again = get_crawler(CatalogueSpider, settings)
    resuming = asyncio.ensure_future(again.crawl_async(base_url=site.url))
    deadline = time.monotonic() + 60
    while not await asyncio.to_thread(redis_client.hexists, keys.run, "resumed"):
        assert not resuming.done() and time.monotonic() < deadline, "no resume recorded"
        await asyncio.sleep(0.2)
    stop = int(await asyncio.to_thread(redis_client.get, keys.stop))
    assert int(await asyncio.to_thread(redis_client.hget, keys.run, "resumed")) >= stop
    await asyncio.to_thread(scrapy_ha, "stop", "catalogue", "--redis-url", redis_url)
    await asyncio.wait_for(resuming, 30)
    assert again.stats.get_value("finish_reason") == "stopped"


@deferred_f_from_coro_f
async def test_revisits_lose_nothing_across_two_workers(redis_url, site, redis_client):
    """Every item page revisited every 2 s by two workers: each URL at its interval (no
    URL twice as often: no double), the crawl's queue holding one entry per URL."""
    interval = 2.0
    settings = {**CONTINUOUS, "REDIS_URL": redis_url, "HA_REVISIT": {r"/item/": interval}}
    crawlers = [get_crawler(CatalogueSpider, settings) for _ in range(2)]
    crawling = [asyncio.ensure_future(c.crawl_async(base_url=site.url)) for c in crawlers]
    await asyncio.sleep(9)
    assert not any(c.done() for c in crawling), "a worker finished by itself"
    stopped = await asyncio.to_thread(scrapy_ha, "stop", "catalogue", "--redis-url", redis_url)
    assert stopped.returncode == 0, stopped.stderr
    await asyncio.wait_for(asyncio.gather(*crawling), 30)
    items = {p: t for p, t in visits(site).items() if p.startswith("/item/")}
    assert len(items) == 50  # the site's 5 list pages x 10
    for path, times in items.items():
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        assert all(g >= interval * 0.9 for g in gaps), (path, gaps)
    keys = Keys("ha", "catalogue")
    queued = await asyncio.to_thread(redis_client.zcard, keys.delayed)
    queued += await asyncio.to_thread(backqueues.count, redis_client, keys)
    assert queued == 50  # one entry per item page, each waiting for its next visit
    stats = await asyncio.to_thread(redis_client.hgetall, keys.stats)
    assert b"revisit_double" not in stats


@deferred_f_from_coro_f
async def test_due_revisits_go_in_the_order_they_are_due_after_new_requests(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS, order="lifo")
    await q.enqueue([entry("a"), entry("b"), entry("c")])
    leases = {name_of(x): x for x in await q.lease(3, 30_000)}
    for name, ms in (("c", 2000), ("b", 1000), ("a", 0)):  # LIFO alone would give c, b, a
        await revisit(q, visit(leases[name], name.encode(), ms=ms))
    await asyncio.sleep(2.1)
    await q.enqueue([entry("new")])  # a request the spider yielded: it goes first
    order = [name_of(x) for x in await q.lease(4, 30_000)]
    assert order == ["new", "a", "b", "c"]
    await q.client.aclose()
