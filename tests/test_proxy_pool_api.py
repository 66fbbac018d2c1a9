"""The proxy list API through real crawls, a real local API (the demo site's
``/proxies.json``) and real local proxies: the list is fetched once per TTL whatever the
requests find in it, one fetch at a time and in the background (a hung API stalls no
request once a list is at hand), an API that fails is tried again with a backoff and one
ERROR, a malformed entry costs itself alone, and a password in the API's URL is sent as
Basic auth and never shown."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest
from scrapy import Request
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.middlewares import proxy_sources
from scrapy_ha.middlewares.proxy import ProxyMiddleware
from tests.spiders import FaultSpider
from tests.test_proxy import pool_crawler, settings
from tests.test_proxy_pool import poll

#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")

SECRET = "T0PS3CRET"
#: Seconds a fetch of the proxy list waits for an API that hangs, in the test of one.
HUNG_FETCH_TIMEOUT = 60


def api_hits(site) -> int:
    return site.hits().get("/proxies.json", 0)


async def crawl_until(crawler, site, paths, condition, what):
    """Run *crawler* over *paths* until *condition* holds, then stop it."""
    crawling = asyncio.ensure_future(crawler.crawl_async(base_url=site.url, paths=paths))
    try:
        await poll(lambda: crawling.done() or condition(), what)
    finally:
        if not crawling.done():
            await crawler.stop_async()
        await crawling


@pytest.mark.parametrize("listed", ["banned", "empty"])
@deferred_f_from_coro_f
async def test_the_list_is_fetched_once_per_ttl_when_no_proxy_is_usable(
    listed, redis_url, site_factory, proxy_factory, caplog
):
    proxy = proxy_factory("--no-auth", "--exits", "1", "--first-exit", "2")
    plist = f"127.0.0.1:{proxy.port}" if listed == "banned" else ""
    site = site_factory("--ban-exit", "127.0.0.2", "--proxy-list", plist)
    paths = tuple(f"/item/{i}" for i in range(1, 31))
    crawler = pool_crawler(
        redis_url, site, HA_PROXY_POOL_TTL=600, CONCURRENT_REQUESTS=4, LOG_LEVEL="INFO"
    )
    await crawl_until(
        crawler,
        site,
        paths,
        lambda: crawler.stats.get_value("ha/proxy/unavailable", 0) >= 20,
        "20 requests found no usable proxy",
    )
    # every one of them asked for a proxy: before, each fetched the list (twice if empty)
    assert crawler.stats.get_value("ha/proxy/unavailable") >= 20
    assert api_hits(site) == 1
    assert caplog.text.count("No usable proxy") == 1  # one ERROR for the run, not one each


@deferred_f_from_coro_f
async def test_a_failing_api_is_retried_with_a_backoff_and_one_error(
    redis_url, site_factory, caplog
):
    site = site_factory("--proxy-list", "127.0.0.1:9", "--proxy-api-auth", "someone:else")
    paths = tuple(f"/item/{i}" for i in range(1, 21))
    crawler = get_crawler(
        FaultSpider,
        settings(
            redis_url,
            HA_PROXY_MODE="pool",
            HA_PROXY_POOL_URL=site.url + "/proxies.json",  # answers 401: no credentials
            CONCURRENT_REQUESTS=4,
            LOG_LEVEL="INFO",
        ),
    )
    started = time.monotonic()
    await crawl_until(
        crawler,
        site,
        paths,
        lambda: time.monotonic() - started > 7,  # past the first retry (5 s), not the second
        "seven seconds",
    )
    assert 1 <= api_hits(site) <= 2  # before: one fetch (or two) per request
    assert crawler.stats.get_value("ha/proxy/errors") >= len(paths)  # every one waited
    assert caplog.text.count("Could not fetch the proxy list") == 1
    assert crawler.spider.ok == [] and site.log()[-1][1] == "/proxies.json"  # none went out


@deferred_f_from_coro_f
async def test_a_hung_api_stalls_no_request_once_a_list_is_at_hand(
    redis_url, site_factory, proxy_factory, monkeypatch
):
    # a fetch waits for the hung API this long: past any crawl of the site, however loaded
    # the machine (with 10 s a crawl under a loaded suite took 11.7 s and failed)
    monkeypatch.setattr(proxy_sources, "POOL_FETCH_TIMEOUT", HUNG_FETCH_TIMEOUT)
    proxy = proxy_factory("--no-auth", "--exits", "1", "--first-exit", "3")
    site = site_factory(
        "--pages",
        "100",
        "--delay",
        "0.05",
        "--proxy-list",
        f"127.0.0.1:{proxy.port}",
        "--proxy-api-hang-after",
        "1",  # the first answer, then never again
    )
    paths = tuple(f"/item/{i}" for i in range(1, 201))
    crawler = pool_crawler(redis_url, site, HA_PROXY_POOL_TTL=0.2, CONCURRENT_REQUESTS=16)
    started = time.monotonic()
    await crawler.crawl_async(base_url=site.url, paths=paths)
    took = time.monotonic() - started
    assert sorted(crawler.spider.ok) == sorted(paths)
    # before, every request that found the list expired waited for the hung API
    assert took < HUNG_FETCH_TIMEOUT, f"the crawl took {took:.1f} s"
    # one fetch at a time: the 16 first requests shared one, then one refresh hung
    assert api_hits(site) == 2


@deferred_f_from_coro_f
async def test_a_malformed_entry_costs_itself_alone(redis_url, site_factory, proxy_factory, caplog):
    proxy = proxy_factory("--no-auth", "--exits", "1", "--first-exit", "3")
    entries = [{"ip": "10.0.0.9"}, "127.0.0.1:80a", {"ip": "127.0.0.1", "port": proxy.port}]
    site = site_factory("--proxy-json", json.dumps(entries))
    paths = tuple(f"/item/{i}" for i in range(1, 7))
    crawler = pool_crawler(redis_url, site, CONCURRENT_REQUESTS=1, LOG_LEVEL="INFO")
    with caplog.at_level(logging.INFO):
        await crawler.crawl_async(base_url=site.url, paths=paths)
    assert sorted(crawler.spider.ok) == sorted(paths)  # before: no proxy, or every 3rd waited
    stats = crawler.stats.get_stats()
    assert stats[f"ha/proxy/127.0.0.1:{proxy.port}/requests"] == len(paths)
    assert stats["ha/proxy/pool_bad_entries"] == 2 and "ha/proxy/errors" not in stats
    assert caplog.text.count("Dropped 2 of the proxy list's entries") == 1


@deferred_f_from_coro_f
async def test_a_password_in_the_api_url_is_sent_as_basic_auth(
    redis_url, site_factory, proxy_factory, caplog
):
    proxy = proxy_factory("--no-auth", "--exits", "1", "--first-exit", "3")
    site = site_factory(
        "--proxy-list", f"127.0.0.1:{proxy.port}", "--proxy-api-auth", f"api-user:{SECRET}"
    )
    paths = ("/item/1", "/item/2")
    api = site.url.replace("://", f"://api-user:{SECRET}@") + "/proxies.json"
    crawler = get_crawler(
        FaultSpider,
        settings(redis_url, HA_PROXY_MODE="pool", HA_PROXY_POOL_URL=api, LOG_LEVEL="INFO"),
    )
    await crawler.crawl_async(base_url=site.url, paths=paths)
    assert sorted(crawler.spider.ok) == sorted(paths)
    assert api_hits(site) == 1
    assert SECRET not in caplog.text


@pytest.mark.parametrize("password", [SECRET, f"pa/{SECRET}", f"p%40ss{SECRET}"])
@deferred_f_from_coro_f
async def test_the_api_s_password_is_never_logged(password, redis_url, caplog):
    # no port: urllib's error quotes the whole authority ("nonnumeric port: 'PW@host'")
    api = f"http://api-user:{password}@127.0.0.1/proxies.json"
    crawler = get_crawler(
        FaultSpider, settings(redis_url, HA_PROXY_MODE="pool", HA_PROXY_POOL_URL=api)
    )
    crawler.stats.open_spider()
    mw = ProxyMiddleware.from_crawler(crawler)
    with caplog.at_level(logging.DEBUG):
        waited = await mw.process_request(Request("http://shop.example/"))
    assert waited is not None  # no list: the request waits in Redis
    assert "Could not fetch the proxy list" in caplog.text
    assert SECRET not in caplog.text and SECRET not in str(waited.meta["ha_outcome"].reason)


@pytest.mark.parametrize(
    "answer",
    ['{"code": 429, "msg": "too many requests"}', '{"data": null}', '"quota exceeded"'],
    ids=["error-object", "data-null", "string"],
)
@deferred_f_from_coro_f
async def test_an_answer_that_holds_no_list_keeps_the_last_list(
    answer, redis_url, tmp_path, caplog
):
    # extraction APIs answer their errors with a 200 and a JSON object: before, it replaced
    # the list with an empty one, and every request waited 30 s for a proxy until the TTL
    listed = tmp_path / "proxies.json"
    listed.write_text(json.dumps(["127.0.0.1:3128"]))
    crawler = get_crawler(
        FaultSpider,
        settings(
            redis_url,
            HA_PROXY_MODE="pool",
            HA_PROXY_POOL_URL=listed.as_uri(),
            HA_PROXY_POOL_TTL=0.05,
        ),
    )
    crawler.stats.open_spider()
    mw = ProxyMiddleware.from_crawler(crawler)
    assert await mw.process_request(Request("http://shop.example/1")) is None
    listed.write_text(answer)
    await asyncio.sleep(0.1)  # the TTL is over: the next request fetches again
    await mw.process_request(Request("http://shop.example/2"))
    await poll(lambda: mw.pool._fetching is None, "the fetch ended")
    request = Request("http://shop.example/3")
    assert await mw.process_request(request) is None  # not sent back to wait for a proxy
    assert request.meta["ha_proxy"] == "127.0.0.1:3128"
    assert crawler.stats.get_value("ha/proxy/pool_errors") == 1
    assert crawler.stats.get_value("ha/proxy/unavailable") is None
    # the ERROR names the setting to look at (before: the URL alone)
    assert f"Could not fetch the proxy list from HA_PROXY_POOL_URL={listed.as_uri()}" in caplog.text
