"""``HA_PROXY_ALLOW_DIRECT``: while the proxy (the tunnel, or every proxy of a pool) is out
of rotation, requests go direct, and the proxy is used again once its cool-down is over.
A proxy whose own upstream is down answers every request with ``502 Bad Gateway`` (a
refused CONNECT for HTTPS, its own 502 response for plain HTTP): before, such a crawl never
went direct, and every page was dead-lettered after its retries through that proxy."""

from __future__ import annotations

import dataclasses
import logging
import time

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.config.middlewares import ProxyConfig
from scrapy_ha.middlewares.proxy import ProxyMiddleware
from scrapy_ha.middlewares.proxy_sources import PRUNED_AT, TunnelProxy
from tests.spiders import FaultSpider
from tests.test_proxy import pool_crawler, settings

#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")

PAGES = tuple(f"/item/{i}" for i in range(1, 7))


def broken_proxy_crawler(mode, redis_url, proxy, lister, **more):
    """A crawler of one request at a time through *proxy* (a tunnel, or a pool that
    *lister* lists) with HA_PROXY_ALLOW_DIRECT, cooled after 2 failures."""
    extra = {
        "HA_PROXY_ALLOW_DIRECT": True,
        "HA_PROXY_MAX_FAILURES": 2,
        "CONCURRENT_REQUESTS": 1,
        **more,
    }
    if mode == "pool":
        return pool_crawler(redis_url, lister, **extra)
    tunnel = {"HA_PROXY_MODE": "tunnel", "HA_PROXY_URL": f"http://127.0.0.1:{proxy.port}"}
    return get_crawler(FaultSpider, settings(redis_url, **tunnel, **extra))


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
@pytest.mark.parametrize("mode", ["tunnel", "pool"])
@deferred_f_from_coro_f
async def test_a_proxy_answering_502_to_everything_lets_requests_go_direct(
    mode, tls, redis_url, site_factory, proxy_factory
):
    proxy = proxy_factory("--no-auth", "--status", "502")
    lister = site_factory("--proxy-list", f"127.0.0.1:{proxy.port}")
    site = site_factory(*(["--tls"] if tls else []))
    crawler = broken_proxy_crawler(mode, redis_url, proxy, lister, HA_PROXY_COOLDOWN=600)
    await crawler.crawl_async(base_url=site.url, paths=PAGES)
    assert sorted(crawler.spider.ok) == sorted(PAGES)
    assert crawler.spider.errors == []
    stats = crawler.stats.get_stats()
    # two failures through it (two pages), then every attempt direct
    assert stats[f"ha/proxy/127.0.0.1:{proxy.port}/requests"] == 2
    assert stats[f"ha/proxy/127.0.0.1:{proxy.port}/failures"] == 2
    assert stats["ha/proxy/direct"] == len(PAGES)
    assert not any(key.startswith("ha/dead") for key in stats)


@deferred_f_from_coro_f
async def test_the_tunnel_is_used_again_after_its_cool_down(redis_url, site_factory, proxy_factory):
    """Direct only while the tunnel cools down: then it is tried again (and, still
    failing, cooled again)."""
    proxy = proxy_factory("--no-auth", "--status", "502")
    site = site_factory("--delay", "0.2")
    pages = tuple(f"/item/{i}" for i in range(1, 21))
    crawler = broken_proxy_crawler("tunnel", redis_url, proxy, site, HA_PROXY_COOLDOWN=1)
    await crawler.crawl_async(base_url=site.url, paths=pages)
    assert sorted(crawler.spider.ok) == sorted(pages)
    stats = crawler.stats.get_stats()
    assert stats[f"ha/proxy/127.0.0.1:{proxy.port}/requests"] > 2
    assert stats["ha/proxy/direct"] >= len(pages)


@deferred_f_from_coro_f
async def test_without_allow_direct_a_tunnel_that_fails_is_never_skipped(
    redis_url, site_factory, proxy_factory
):
    """HA_PROXY_ALLOW_DIRECT off: no request leaves without the tunnel proxy."""
    proxy = proxy_factory("--no-auth", "--status", "502")
    site = site_factory()
    crawler = broken_proxy_crawler(
        "tunnel",
        redis_url,
        proxy,
        site,
        HA_PROXY_ALLOW_DIRECT=False,
        HA_RETRY_POLICIES={"server": {"times": 1}},
    )
    await crawler.crawl_async(base_url=site.url, paths=PAGES[:3])
    assert crawler.spider.ok == []
    stats = crawler.stats.get_stats()
    assert stats[f"ha/proxy/127.0.0.1:{proxy.port}/requests"] == 6  # every attempt
    assert "ha/proxy/direct" not in stats


@deferred_f_from_coro_f
async def test_a_sites_own_502_over_https_keeps_the_tunnel(redis_url, site_factory, proxy_factory):
    """Inside the CONNECT tunnel every status is the site's: pages that answer 502 through
    a working tunnel proxy never send the crawl direct."""
    proxy = proxy_factory("--no-auth", "--exits", "1")
    site = site_factory("--tls")
    paths = tuple(p for i in range(1, 4) for p in (f"/flaky/{i}?fail=99&status=502", f"/item/{i}"))
    crawler = broken_proxy_crawler(
        "tunnel", redis_url, proxy, None, HA_RETRY_POLICIES={"server": {"times": 1}}
    )
    await crawler.crawl_async(base_url=site.url, paths=paths)
    assert sorted(crawler.spider.ok) == [f"/item/{i}" for i in range(1, 4)]
    stats = crawler.stats.get_stats()
    assert stats[f"ha/proxy/127.0.0.1:{proxy.port}/requests"] == 9  # every attempt
    assert "ha/proxy/direct" not in stats and "ha/proxy/rotations" not in stats


@pytest.mark.parametrize("mode", ["tunnel", "pool"])
def test_going_direct_is_said_at_start(mode, caplog):
    """The setting did nothing in tunnel mode before: a crawl that kept it from an earlier
    configuration now sends requests from this machine's address while the proxy fails,
    and its log says so once, at start (a review)."""
    where = {"HA_PROXY_URL": "http://u:secret@127.0.0.1:9"}
    if mode == "pool":
        where = {"HA_PROXY_POOL_URL": "http://127.0.0.1:9/list"}
    crawler = get_crawler(
        FaultSpider, {"HA_PROXY_MODE": mode, "HA_PROXY_ALLOW_DIRECT": True, **where}
    )
    crawler.stats.open_spider()
    with caplog.at_level(logging.INFO, logger="scrapy_ha.middlewares.proxy"):
        ProxyMiddleware.from_crawler(crawler)
    said = [r.getMessage() for r in caplog.records if "HA_PROXY_ALLOW_DIRECT" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert "direct, from this machine's own address" in said[0]
    assert "secret" not in caplog.text


def test_the_tunnels_cool_downs_per_site_are_forgotten_once_over():
    """A broad crawl through a tunnel that may go direct cools the tunnel for each site
    that bans it: before, every site's cool-down stayed in the worker's memory for the
    whole crawl (10,000 banned sites: 10,000 entries, long after they were over)."""
    config = ProxyConfig(
        mode="tunnel", url="http://u:p@127.0.0.1:9", cooldown=600, allow_direct=True
    )
    tunnel = TunnelProxy(config)
    live = [f"live-{i}.example" for i in range(5)]
    for host in live:
        tunnel.cool_down(tunnel.id, host)
    tunnel.config = dataclasses.replace(config, cooldown=0)  # over as soon as set
    for i in range(10_000):
        tunnel.cool_down(tunnel.id, f"site-{i}.example")
    assert len(tunnel.cooling) <= PRUNED_AT
    now = time.time()
    assert all(tunnel.out(tunnel.id, host, now) for host in live)  # those still on are kept
    assert not tunnel.out(tunnel.id, "site-9999.example", now + 1)
