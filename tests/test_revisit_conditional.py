"""Conditional revisits and change detection (scrapy_ha.revisit.RevisitMiddleware) against
bench/freshness_site.py, whose pages change only when the test says: a 304 or an unchanged
page never reaches the callback, a changed one does; adaptive intervals grow while a page
does not change, and a changed page's Last-Modified dates its change."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import pytest
import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.demo import harness
from scrapy_ha.keys import Keys
from scrapy_ha.revisit import NotModified

ROOT = Path(__file__).resolve().parent.parent
KEYS = Keys("ha", "pages")


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


@pytest.fixture
def changing_site():
    def start(*args: str) -> str:
        proc, ports = harness.start_listening(
            [sys.executable, str(ROOT / "bench" / "freshness_site.py"), "--pages", "3", *args]
        )
        started.append(proc)
        return f"http://127.0.0.1:{ports[0]}"

    started: list[Any] = []
    yield start
    for proc in started:
        harness.stop(proc)


class PagesSpider(scrapy.Spider):
    name = "pages"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base_url = base_url
        self.parsed: list[tuple[str, str]] = []
        self.unchanged: list[tuple[str, str, int]] = []

    async def start(self) -> Any:
        for i in range(3):
            yield scrapy.Request(f"{self.base_url}/p/{i}", errback=self.on_error)

    def parse(self, response: Any) -> None:
        version = response.css("p::text").get()
        self.parsed.append((response.url.rsplit("/", 1)[1], version))

    def on_error(self, failure: Any) -> None:
        if failure.check(NotModified):
            exc = failure.value
            self.unchanged.append(
                (exc.response.url.rsplit("/", 1)[1], exc.found, exc.response.status)
            )


def settings(redis_url: str, **extra: Any) -> dict[str, Any]:
    return {
        "ADDONS": {"scrapy_ha.Addon": 0},
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.3,
        "HA_LEASE_TIME": 3,
        "HA_LEASE_RENEW_INTERVAL": 0.5,
        "HA_HEARTBEAT_TTL": 3,
        "HA_REVISIT": {"/p/": 1.0},
        "LOG_LEVEL": "INFO",
        **extra,
    }


def get(url: str) -> Any:
    with urlopen(url) as r:
        return json.load(r) if "/_" in url and "_change" not in url else r.read()


def fetches(base: str, page: int) -> int:
    return sum(1 for _, p, _, _ in get(f"{base}/_log") if p == page)


async def until(check, what: str, crawling: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(check):
        assert not crawling.done(), f"the crawl finished by itself before {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        await asyncio.sleep(0.1)


async def stop(crawling: Any, redis_client: Any) -> None:
    now = await asyncio.to_thread(redis_client.time)
    await asyncio.to_thread(redis_client.set, KEYS.stop, now[0] * 1000 + now[1] // 1000)
    await asyncio.wait_for(crawling, 30)


async def crawl_until(crawler: Any, base: str, redis_client: Any, *, visits: int) -> None:
    """Crawl until page 0 was fetched *visits* times, then stop."""
    crawling = asyncio.ensure_future(crawler.crawl_async(base_url=base))
    await until(lambda: fetches(base, 0) >= visits, f"{visits} visits", crawling)
    await stop(crawling, redis_client)


@deferred_f_from_coro_f
async def test_an_unchanged_page_is_a_304_and_never_reaches_the_callback(
    redis_url, redis_client, changing_site
):
    base = changing_site("--static")
    crawler = get_crawler(PagesSpider, settings(redis_url))
    crawling = asyncio.ensure_future(crawler.crawl_async(base_url=base))
    await until(lambda: fetches(base, 1) >= 2, "a revisit of page 1", crawling)
    await asyncio.to_thread(get, f"{base}/_change?page=1")
    await until(lambda: fetches(base, 1) >= 4, "two revisits after the change", crawling)
    await stop(crawling, redis_client)
    spider = crawler.spider
    parsed = [page for page, _ in spider.parsed]
    assert sorted(parsed) == ["0", "1", "1", "2"]  # first visits, and page 1 once changed
    assert ("1", "version 1") in spider.parsed
    log = get(f"{base}/_log")
    statuses = {page: [s for _, p, s, _ in log if p == page] for page in (0, 1, 2)}
    assert all(s == [200] + [304] * (len(s) - 1) for p, s in statuses.items() if p != 1), statuses
    assert statuses[1][:1] == [200] and statuses[1].count(200) == 2, statuses  # first, changed
    assert {found for _, found, _ in spider.unchanged} == {"not_modified"}
    assert len(spider.unchanged) == sum(1 for _, _, s, _ in log if s == 304)
    stats = crawler.stats
    assert stats.get_value("ha/revisit/new") == 3
    assert stats.get_value("ha/revisit/changed") == 1
    assert stats.get_value("ha/revisit/not_modified") >= 3
    crawl = {k.decode(): int(v) for k, v in redis_client.hgetall(KEYS.stats).items()}
    assert crawl["revisit_saved"] >= 3 * 4000  # bodies of a few KB not sent again
    assert crawl["revisited:not_modified"] == stats.get_value("ha/revisit/not_modified")


@deferred_f_from_coro_f
async def test_without_conditional_requests_the_same_content_counts_as_unchanged(
    redis_url, redis_client, changing_site
):
    base = changing_site("--static", "--no-conditional")
    crawler = get_crawler(PagesSpider, settings(redis_url))
    await crawl_until(crawler, base, redis_client, visits=3)
    spider = crawler.spider
    assert sorted(page for page, _ in spider.parsed) == ["0", "1", "2"]  # first visits only
    assert spider.unchanged and {(f, s) for _, f, s in spider.unchanged} == {("unchanged", 200)}
    assert crawler.stats.get_value("ha/revisit/unchanged") == len(spider.unchanged)


@deferred_f_from_coro_f
async def test_adaptive_intervals_grow_while_a_page_does_not_change(
    redis_url, redis_client, changing_site
):
    base = changing_site("--static")
    extra = {"HA_REVISIT_ADAPTIVE": True, "HA_REVISIT_MIN": 1, "HA_REVISIT": {"/p/": 1.2}}
    crawler = get_crawler(PagesSpider, settings(redis_url, **extra))
    await crawl_until(crawler, base, redis_client, visits=5)
    times = [t for t, page, _, _ in get(f"{base}/_log") if page == 0]
    gaps = [round(b - a, 2) for a, b in zip(times, times[1:], strict=False)]
    assert len(gaps) >= 3, gaps
    # a page never found changed: its first visit's age (unchanged since the site started,
    # seconds ago) already puts it well past the configured interval, and its change
    # rate's estimate falls visit after visit, so the gaps do not come back under the
    # first; the budget (the configured intervals', 3 pages every 1.2 s) lowers the
    # multiplier meanwhile, which holds them back
    assert min(gaps) > 1.2 * 4 and max(gaps[1:]) > gaps[0], gaps
    state = [json.loads(p) for p in redis_client.hvals(KEYS.payload)]
    intervals = sorted(doc["mt"]["ha_revisit_state"]["i"] for doc in state)
    assert all(i > 1.2 * 1.4**2 * 0.99 for i in intervals), intervals
    # the crawl's budget: the load of the intervals scheduled, under the configured
    # intervals' (3 pages every 1.2 s), so the multiplier fell from its start
    raw = redis_client.hgetall(KEYS.revisit_alloc)  # the sums, and e:<id>: what each holds
    alloc = {k.decode(): float(v) for k, v in raw.items() if not k.startswith(b"e:")}
    assert alloc["base"] == pytest.approx(3 / 1.2)
    assert 0 < alloc["load"] < alloc["base"]
    assert 0 < alloc["mu"] < 0.264 * 1.2


@deferred_f_from_coro_f
async def test_a_changed_page_s_last_modified_dates_its_change(
    redis_url, redis_client, changing_site
):
    base = changing_site("--static")
    extra = {"HA_REVISIT_ADAPTIVE": True, "HA_REVISIT_MIN": 1, "HA_REVISIT": {"/p/": 1.2}}
    crawler = get_crawler(PagesSpider, settings(redis_url, **extra))
    crawling = asyncio.ensure_future(crawler.crawl_async(base_url=base))
    await until(lambda: fetches(base, 1) >= 2, "a revisit of page 1", crawling)
    await asyncio.to_thread(get, f"{base}/_change?page=1")
    await until(lambda: fetches(base, 1) >= 4, "two revisits after the change", crawling)
    await stop(crawling, redis_client)
    docs = [json.loads(p) for p in redis_client.hvals(KEYS.payload)]
    states = {doc["u"].rsplit("/", 1)[1]: doc["mt"]["ha_revisit_state"] for doc in docs}
    # page 1's change is dated by its Last-Modified (within the interval it was found in),
    # not counted as an interval that ended changed; the others never changed
    assert states["1"]["c"] == 1 and states["1"].get("y") == 1, states
    assert states["1"].get("x", 0) == 0, states
    assert all("y" not in states[p] and states[p]["c"] == 0 for p in ("0", "2")), states
    # their first visit counted their age (the seconds since the site started) unchanged
    assert all(states[p]["u"] > 0 for p in ("0", "1", "2")), states
