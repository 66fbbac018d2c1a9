"""Retries and the dead-letter queue in real crawls against the demo site and Redis."""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from typing import Any
from urllib.request import urlopen

import pytest
import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.keys import Keys
from tests.spiders import FaultSpider

FAST_RETRIES = {
    "ADDONS": {"scrapy_ha.Addon": 0},
    "HA_IDLE_TIMEOUT": 0.5,
    "HA_RETRY_JITTER": 0,
    "HA_RETRY_BACKOFF_BASE": 0.3,
    "HA_RETRY_BACKOFF_MULTIPLIER": 2,
    "HA_RETRY_TIMES": 2,
    "HA_RETRY_POLICIES": {"network": {"base": 0.3}, "parse": {"base": 0.3}, "banned": {"times": 1}},
    "DOWNLOAD_TIMEOUT": 1,
    "SCHEDULER_PERSIST": True,
    "LOG_LEVEL": "INFO",
}


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


def hit_log(site) -> dict[str, list[float]]:
    with urlopen(site.url + "/_log") as r:
        times: dict[str, list[float]] = defaultdict(list)
        for t, path, *_ in json.load(r):
            times[path].append(t)
        return times


async def watch_gate(
    redis_client, keys: Keys, crawlers: list, crawling: asyncio.Future, timeout: float = 60
) -> tuple[float, float]:
    """(When every worker held a domain gate, when it opens): both on the host's wall clock,
    the opening read from Redis (the gate's time, in ms on the Redis server's clock)."""
    from scrapy_ha.middlewares.registry import scheduler_for

    deadline = time.monotonic() + timeout
    open_at = None
    while True:
        assert not crawling.done() and time.monotonic() < deadline, "no gate closed"
        gates = redis_client.hgetall(keys.gates)
        if gates and open_at is None:
            open_at = int(max(gates.values())) / 1000
        schedulers = [scheduler_for(c) for c in crawlers]
        if open_at is not None and all(s is not None and s.closed for s in schedulers):
            return time.time(), open_at
        await asyncio.sleep(0.01)


def dead_letters(redis_client, spider: str) -> dict[str, dict]:
    keys = Keys("ha", spider)
    out = {}
    for entry_id, info in redis_client.hgetall(keys.dead_info).items():
        payload = json.loads(redis_client.hget(keys.payload, entry_id))
        out[payload["u"].split(":", 2)[2].split("/", 1)[1]] = json.loads(info)
    return out


@deferred_f_from_coro_f
async def test_every_failure_class_ends_crawled_or_dead_lettered(redis_url, redis_client, site):
    paths = {
        "/flaky/1?fail=2&status=500": "ok",  # server: 2 retries, then fine
        "/flaky/2?fail=9&status=503": "server",  # server: budget (2) spent
        "/status/404": "gone",  # no retry
        "/status/410": "gone",
        "/status/400": "client",
        "/flaky/3?fail=9&status=403": "banned",  # banned: its own budget (1)
        "/flaky/4?fail=1&status=timeout": "ok",  # network: retried soon
        "/flaky/5?fail=1&status=broken": "ok",  # parse error, retried
        "/flaky/6?fail=9&status=broken": "parse",  # parse: budget spent
        "/item/7?permanent": "permanent",  # PermanentError from the callback
    }
    crawler = get_crawler(FaultSpider, {**FAST_RETRIES, "REDIS_URL": redis_url})
    await crawler.crawl_async(base_url=site.url, paths=tuple(paths))
    spider = crawler.spider
    expected_ok = sorted(p for p, want in paths.items() if want == "ok")
    assert sorted(spider.ok) == expected_ok
    dead = dead_letters(redis_client, "faults")
    assert {p: d["class"] for p, d in dead.items()} == {
        p.lstrip("/"): want for p, want in paths.items() if want != "ok"
    }
    assert dead["flaky/2?fail=9&status=503"]["reason"] == "HTTP 503"
    assert dead["flaky/2?fail=9&status=503"]["status"] == 503
    assert [h["outcome"] for h in dead["flaky/2?fail=9&status=503"]["history"]] == ["HTTP 503"] * 3
    assert dead["flaky/6?fail=9&status=broken"]["reason"].startswith("builtins.TypeError")
    assert all(d["first"] <= d["last"] for d in dead.values())
    # errbacks still see the HTTP errors, as with Scrapy's own retry middleware
    assert "/status/404" in spider.errors and "/flaky/2?fail=9&status=503" in spider.errors
    stats = crawler.stats.get_stats()
    assert stats["ha/dead/gone"] == 2 and stats["ha/dead/server"] == 1
    assert stats["ha/retry/count"] == 2 + 2 + 1 + 1 + 1 + 2  # 500, 503, 403, timeout, parse x2
    counts = {
        k: redis_client.zcard(Keys("ha", "faults")._key(k))
        for k in ("pending", "leased", "delayed")
    }
    assert counts == {"pending": 0, "leased": 0, "delayed": 0}
    # retries are spaced as configured: 0.3 s, then 0.6 s (no jitter here)
    times = hit_log(site)["/flaky/1?fail=2&status=500"]
    gaps = [b - a for a, b in zip(times[:-1], times[1:], strict=True)]
    assert len(times) == 3
    assert 0.3 <= gaps[0] < 0.3 + 1.5 and 0.6 <= gaps[1] < 0.6 + 1.5, gaps


@deferred_f_from_coro_f
async def test_a_429_closes_the_domain_for_every_worker_until_retry_after(
    redis_url, redis_client, site_factory
):
    site = site_factory("--pages", "5", "--per-page", "10", "--delay", "0.05")
    paths = ("/flaky/1?fail=1&status=429&retry_after=2", *(f"/item/{i}" for i in range(2, 40)))
    worker = {**FAST_RETRIES, "REDIS_URL": redis_url, "CONCURRENT_REQUESTS": 1, "HA_PREFETCH": 1}
    crawlers = [get_crawler(FaultSpider, worker) for _ in range(2)]
    crawling = asyncio.gather(*(c.crawl_async(base_url=site.url, paths=paths) for c in crawlers))
    gate = await watch_gate(redis_client, Keys("ha", "faults"), crawlers, crawling)
    await crawling
    assert sorted(p for c in crawlers for p in c.spider.ok) == sorted(
        ["/flaky/1?fail=1&status=429&retry_after=2", *paths[1:]]
    )
    log = hit_log(site)
    closed_at = log[paths[0]][0]
    assert log[paths[0]][1] - closed_at >= 2  # the retry waited for Retry-After
    # Timed by the gate itself, not by a fixed window after the 429 (how long a worker takes
    # to learn of the gate depends on the machine's load): the gate closes the domain until
    # `open_at` on the Redis server's clock (the same host clock as the site's log). Once
    # every worker holds the gate, each can still have its one request (CONCURRENT_REQUESTS=1)
    # on the wire, and nothing more reaches the domain until it opens again.
    known_at, open_at = gate
    during = [t for ts in log.values() for t in ts if known_at < t < open_at]
    assert len(during) <= len(crawlers), (during, known_at, open_at)
    assert sum(c.stats.get_value("ha/deferred", 0) for c in crawlers) > 0


def no_rate_limited_retry(redis_url: str, **extra: Any) -> dict[str, Any]:
    """A worker's settings with the ``rate_limited`` budget at 0 (no retry of a 429)."""
    policies = {**FAST_RETRIES["HA_RETRY_POLICIES"], "rate_limited": {"times": 0}}
    return {**FAST_RETRIES, "REDIS_URL": redis_url, "HA_RETRY_POLICIES": policies, **extra}


@deferred_f_from_coro_f
async def test_a_429_that_spends_the_budget_still_closes_its_domain(
    redis_url, redis_client, site_factory
):
    """A 429 whose request has no retry left closed no gate: the site's Retry-After was
    ignored and the domain's other requests went on at full speed (a QA run: 30 requests
    in 0.13 s after "Retry-After: 60", with the rate_limited budget at 0)."""
    site = site_factory("--pages", "5", "--per-page", "10", "--delay", "0.05")
    paths = ("/flaky/1?fail=9&status=429&retry_after=2", *(f"/item/{i}" for i in range(2, 20)))
    worker = no_rate_limited_retry(redis_url, CONCURRENT_REQUESTS=1, HA_PREFETCH=1)
    crawler = get_crawler(FaultSpider, worker)
    crawling = asyncio.ensure_future(crawler.crawl_async(base_url=site.url, paths=paths))
    known_at, open_at = await watch_gate(redis_client, Keys("ha", "faults"), [crawler], crawling)
    await crawling
    assert dead_letters(redis_client, "faults")[paths[0][1:]]["class"] == "rate_limited"
    assert sorted(crawler.spider.ok) == sorted(paths[1:])
    during = [t for ts in hit_log(site).values() for t in ts if known_at < t < open_at]
    assert len(during) <= 1, (during, known_at, open_at)  # (one on the wire at most)


@deferred_f_from_coro_f
async def test_an_unreadable_retry_after_is_a_backoff_not_a_lost_request(
    redis_url, redis_client, site
):
    """A Retry-After of b'\\xb9' (latin-1 '¹', which str.isdigit() accepts). Before:
    float('¹') raised in the middleware, Scrapy logged an error, and the request was acked:
    neither retried nor dead-lettered."""
    paths = (
        "/flaky/1?fail=1&status=429&retry_after=%B9",
        "/flaky/2?fail=9&status=429&retry_after=%B2",
    )
    crawler = get_crawler(FaultSpider, {**FAST_RETRIES, "REDIS_URL": redis_url})
    await crawler.crawl_async(base_url=site.url, paths=paths)
    assert crawler.spider.ok == [paths[0]]  # retried after the class's backoff
    dead = dead_letters(redis_client, "faults")
    assert {p: d["class"] for p, d in dead.items()} == {paths[1][1:]: "rate_limited"}
    assert dead[paths[1][1:]]["attempts"] == 3  # the budget (2 retries) spent, then dead
    # a fourth hit when both were downloading together: the first 429 closed the gate, and
    # the other's waited for it without an attempt
    assert len(hit_log(site)[paths[1]]) in (3, 4)


@deferred_f_from_coro_f
async def test_dead_letters_without_an_age_limit_are_made_and_the_crawl_closes(
    redis_url, redis_client, site
):
    """HA_DLQ_MAX_AGE = inf: keep dead letters whatever their age. Before: int(inf * 1000)
    failed every dead letter and every reclaim in the background loop; the 404 was neither
    acked nor dead-lettered and the crawl never closed."""
    settings = {**FAST_RETRIES, "REDIS_URL": redis_url, "HA_DLQ_MAX_AGE": float("inf")}
    crawler = get_crawler(FaultSpider, settings)
    crawling = asyncio.ensure_future(
        crawler.crawl_async(base_url=site.url, paths=("/status/404", "/item/1"))
    )
    try:
        await asyncio.wait_for(asyncio.shield(crawling), 30)
    finally:
        if not crawling.done():
            await crawler.stop_async()
            await crawling
    assert crawler.spider.ok == ["/item/1"]
    assert {p: d["class"] for p, d in dead_letters(redis_client, "faults").items()} == {
        "status/404": "gone"
    }


class BadMetaSpider(FaultSpider):
    """A request whose meta Scrapy cannot use (``download_timeout`` of text), one that a
    middleware drops on purpose (IgnoreRequest: off-site), one too large, and a good one."""

    name = "badmeta"
    allowed_domains = ["127.0.0.1"]

    async def start(self) -> Any:
        yield scrapy.Request(self.base_url + "/status/200?bad", meta={"download_timeout": "abc"})
        yield scrapy.Request("http://offsite.example/x")
        # past its DOWNLOAD_MAXSIZE: cancelled by Scrapy, acked as done (as before)
        yield scrapy.Request(self.base_url + "/status/200?big", meta={"download_maxsize": 5})
        yield scrapy.Request(self.base_url + "/status/200?good")

    def parse(self, response: Any) -> Any:
        self.ok.append(response.url.replace(self.base_url, ""))


@deferred_f_from_coro_f
async def test_a_download_error_no_class_names_is_dead_lettered_not_lost(
    redis_url, redis_client, site
):
    """The request failed with a TypeError: it was acked as done, with one "Error
    downloading" line, and nowhere in Redis (0 items, exit 0). A request a middleware
    drops on purpose stays dropped."""
    crawler = get_crawler(BadMetaSpider, {**FAST_RETRIES, "REDIS_URL": redis_url})
    await crawler.crawl_async(base_url=site.url)
    assert crawler.spider.ok == ["/status/200?good"]
    dead = dead_letters(redis_client, "badmeta")
    assert list(dead) == ["status/200?bad"], dead
    assert dead["status/200?bad"]["class"] == "permanent"
    assert dead["status/200?bad"]["reason"].startswith("builtins.TypeError"), dead
    assert crawler.stats.get_value("ha/dead/permanent") == 1


@deferred_f_from_coro_f
async def test_requests_in_flight_when_a_429_closes_the_gate_spend_no_attempt(
    redis_url, redis_client, site_factory
):
    """Eight requests of one domain downloading together, each answered 429 once: the first
    answer closes the gate; the seven others were sent before it closed, and wait for it
    without an attempt. Before, each spent one on its own 429: with no retry left
    (``rate_limited`` budget 0) all eight were dead-lettered."""
    site = site_factory("--pages", "5", "--per-page", "10")
    # each answered a second late: all eight reach the site before the first answer
    paths = [f"/flaky/{n}?fail=1&status=429&retry_after=1&delay=1" for n in range(1, 9)]
    worker = no_rate_limited_retry(redis_url, CONCURRENT_REQUESTS=8, DOWNLOAD_TIMEOUT=10)
    crawler = get_crawler(FaultSpider, worker)
    await crawler.crawl_async(base_url=site.url, paths=paths)
    dead = dead_letters(redis_client, "faults")
    assert len(dead) == 1 and next(iter(dead.values()))["class"] == "rate_limited", dead
    assert len(crawler.spider.ok) == 7, crawler.spider.ok
    assert crawler.stats.get_value("ha/retry/gate_waits") == 7
    assert crawler.stats.get_value("ha/retry/count", 0) == 0  # (none had a retry to spend)


@deferred_f_from_coro_f
async def test_a_domain_that_answers_429_to_everything_gets_each_request_a_bounded_number_of_times(
    redis_url, redis_client, site_factory
):
    """A review's finding on the first version of the gate waits: they had no bound, so
    each request in flight waited at every reopening of the gate, and a domain answering
    429 to everything was hit about as many times more than the budget as requests ran at
    once (16 requests of budget 2: 200 hits; the slow one 22). A request waits for a gate
    once between two attempts."""
    site = site_factory("--pages", "5", "--per-page", "10")
    paths = [f"/flaky/{n}?fail=1000&status=429&retry_after=1" for n in range(1, 16)]
    paths.append("/flaky/40?fail=1000&status=429&retry_after=1&delay=1")
    policies = {**FAST_RETRIES["HA_RETRY_POLICIES"], "rate_limited": {"times": 1}}
    worker = {
        **FAST_RETRIES,
        "REDIS_URL": redis_url,
        "CONCURRENT_REQUESTS": 8,
        "DOWNLOAD_TIMEOUT": 10,
        "HA_RETRY_POLICIES": policies,
    }
    crawler = get_crawler(FaultSpider, worker)
    await crawler.crawl_async(base_url=site.url, paths=paths)
    dead = dead_letters(redis_client, "faults")
    assert len(dead) == 16 and {d["attempts"] for d in dead.values()} == {2}, dead
    hits = {path: len(times) for path, times in hit_log(site).items() if path in paths}
    assert max(hits.values()) <= 4, hits  # two attempts, each after one wait at most
