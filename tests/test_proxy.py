"""Proxy rotation through a real forward proxy on loopback (HTTP and CONNECT, Basic auth,
several exits that the target site sees as client addresses)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.keys import Keys
from tests import backqueues
from tests.spiders import FaultSpider

SECRET = "s3cret-pw"
EXITS = {"127.0.0.2", "127.0.0.3", "127.0.0.4"}


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


def settings(redis_url: str, **extra):
    return {
        "ADDONS": {"scrapy_ha.Addon": 0},
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.5,
        "HA_RETRY_JITTER": 0,
        "HA_RETRY_BACKOFF_BASE": 0.2,
        "SCHEDULER_PERSIST": True,
        "LOG_LEVEL": "DEBUG",
        **extra,
    }


def pool_crawler(redis_url: str, site: Any, **more: Any) -> Any:
    """A crawler of FaultSpider through the pool the demo site's ``/proxies.json`` lists."""
    pool = {"HA_PROXY_MODE": "pool", "HA_PROXY_POOL_URL": site.url + "/proxies.json"}
    return get_crawler(FaultSpider, settings(redis_url, **pool, **more))


def everything_in_redis(url: str) -> bytes:
    client = redis.Redis.from_url(url)
    dump = b""
    for key in client.keys("*"):
        kind = client.type(key)
        if kind == b"hash":
            dump += b"".join(k + v for k, v in client.hgetall(key).items())
        elif kind == b"zset":
            dump += b"".join(m for m, _ in client.zrange(key, 0, -1, withscores=True))
        elif kind == b"string":
            dump += client.get(key)
    client.close()
    return dump


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
@deferred_f_from_coro_f
async def test_a_ban_changes_the_exit_on_the_next_attempt(
    tls, redis_url, site_factory, proxy_factory, caplog
):
    site = site_factory("--ban-exit", "127.0.0.2", *(["--tls"] if tls else []))
    proxy = proxy_factory("--user", "crawler", "--password", SECRET, "--exits", "3")
    paths = tuple(f"/item/{i}" for i in range(1, 6))
    crawler = get_crawler(
        FaultSpider,
        settings(
            redis_url,
            HA_PROXY_MODE="tunnel",
            HA_PROXY_URL=f"http://crawler:{SECRET}@127.0.0.1:{proxy.port}",
            HA_PROXY_SESSION_TEMPLATE="{user}-session-{session}",
            CONCURRENT_REQUESTS=1,
        ),
    )
    await crawler.crawl_async(base_url=site.url, paths=paths)
    assert sorted(crawler.spider.ok) == sorted(paths)
    log = site.log()
    clients = [client for _, _, client in log]
    assert set(clients) <= EXITS  # every request went through the proxy
    assert clients[0] == "127.0.0.2"  # the first session's exit is banned at the site...
    assert all(c != "127.0.0.2" for c in clients[1:])  # ...the next attempt left elsewhere
    stats = crawler.stats.get_stats()
    assert stats["ha/proxy/rotations"] == 1
    assert stats[f"ha/proxy/127.0.0.1:{proxy.port}/bans"] == 1
    assert stats["ha/retry/banned"] == 1 and "ha/retry/server" not in stats
    assert SECRET not in caplog.text
    assert SECRET.encode() not in everything_in_redis(redis_url)
    assert not any(SECRET in str(v) for v in stats.values()) and not any(SECRET in k for k in stats)


@deferred_f_from_coro_f
async def test_without_a_session_an_https_tunnel_keeps_its_exit(
    redis_url, site_factory, proxy_factory
):
    site = site_factory("--tls")
    proxy = proxy_factory("--user", "crawler", "--password", SECRET, "--exits", "3")
    paths = tuple(f"/item/{i}" for i in range(1, 6))
    crawler = get_crawler(
        FaultSpider,
        settings(
            redis_url,
            HA_PROXY_MODE="tunnel",
            HA_PROXY_URL=f"http://127.0.0.1:{proxy.port}",
            HA_PROXY_USER="crawler",
            HA_PROXY_PASSWORD=SECRET,
            CONCURRENT_REQUESTS=1,
        ),
    )
    await crawler.crawl_async(base_url=site.url, paths=paths)
    assert sorted(crawler.spider.ok) == sorted(paths)
    assert len({client for _, _, client in site.log()}) == 1  # one kept-alive CONNECT tunnel


class SlowStartSpider(FaultSpider):
    """Yields its start requests 0.2 s apart: the proxy's 407 stops the crawl while
    ``start()`` still yields (the engine goes on reading it while the spider closes)."""

    async def start(self) -> Any:
        async for request in super().start():
            yield request
            await asyncio.sleep(0.2)


def assert_stored_requests_kept(client: redis.Redis) -> int:
    """Every request Redis stored is still pending, leased or delayed: none acked, none
    dead-lettered; return how many. (A start request the engine read from ``start()``
    after the scheduler's last flush never reached Redis: the next run yields it again.)"""
    keys = Keys("ha", "faults")
    kept = backqueues.count(client, keys) + sum(
        client.zcard(k) for k in (keys.leased, keys.delayed)
    )
    stored = int(client.hget(keys.stats, "enqueued") or 0)  # (entry ids go by hundreds)
    assert kept == stored, "a stored request was consumed or lost"
    assert client.zcard(keys.dead) == 0 and int(client.hget(keys.stats, "acked") or 0) == 0
    return kept


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
@pytest.mark.parametrize("spider", [FaultSpider, SlowStartSpider], ids=["start", "slow-start"])
@deferred_f_from_coro_f
async def test_407_stops_the_crawl_once_and_keeps_the_requests(
    spider, tls, redis_url, redis_client, site_factory, proxy_factory, caplog
):
    site = site_factory(*(["--tls"] if tls else []))
    proxy = proxy_factory("--user", "crawler", "--password", SECRET)
    paths = tuple(f"/item/{i}" for i in range(1, 21))
    crawler = get_crawler(
        spider,
        settings(
            redis_url,
            HA_PROXY_MODE="tunnel",
            HA_PROXY_URL=f"http://crawler:wrong-pw@127.0.0.1:{proxy.port}",
        ),
    )
    await crawler.crawl_async(base_url=site.url, paths=paths)
    assert crawler.stats.get_value("finish_reason") == "proxy_auth_failed"
    assert caplog.text.count("rejected its credentials") == 1
    assert "wrong-pw" not in caplog.text
    assert site.log() == []
    kept = assert_stored_requests_kept(redis_client)
    assert kept >= 1
    if spider is SlowStartSpider:
        assert kept < len(paths)  # the crawl stopped while start() was still yielding


@deferred_f_from_coro_f
async def test_the_api_pool_drops_a_banned_proxy_for_every_worker(
    redis_url, redis_client, site_factory, proxy_factory
):
    proxies = [
        proxy_factory("--no-auth", "--exits", "1", "--first-exit", str(n)) for n in (2, 3, 4)
    ]
    site = site_factory(
        "--ban-exit", "127.0.0.2", "--proxy-list", ",".join(f"127.0.0.1:{p.port}" for p in proxies)
    )
    paths = tuple(f"/item/{i}" for i in range(1, 16))
    crawler = pool_crawler(redis_url, site, CONCURRENT_REQUESTS=1)
    await crawler.crawl_async(base_url=site.url, paths=paths)
    assert sorted(crawler.spider.ok) == sorted(paths)
    clients = [client for _, path, client in site.log() if path.startswith("/item/")]
    banned_at = clients.index("127.0.0.2")
    assert "127.0.0.2" not in clients[banned_at + 1 :]
    assert {"127.0.0.3", "127.0.0.4"} <= set(clients)
    shared = redis_client.hgetall(Keys("ha", "faults").proxy_cooldowns)
    assert list(shared) == [f"127.0.0.1:{proxies[0].port} 127.0.0.1".encode()]  # its site's


@deferred_f_from_coro_f
async def test_a_site_that_bans_a_pool_proxy_takes_it_from_itself_alone(
    redis_url, redis_client, site_factory, proxy_factory
):
    """A 403 of one site cooled its pool proxy for every site of the crawl: another site,
    at another host, that never banned it was crawled through the other proxies only."""
    proxies = [proxy_factory("--no-auth", "--exits", "1", "--first-exit", str(n)) for n in (2, 3)]
    listed = ",".join(f"127.0.0.1:{p.port}" for p in proxies)
    banning = site_factory("--ban-exit", "127.0.0.2", "--proxy-list", listed)
    other = site_factory("--interface", "127.0.0.9")
    assert other.url.startswith("http://127.0.0.9:")
    paths = (banning.url + "/item/1", *(other.url + f"/item/{i}" for i in range(2, 12)))
    crawler = pool_crawler(redis_url, banning, CONCURRENT_REQUESTS=1, HA_PROXY_COOLDOWN=600)
    await crawler.crawl_async(base_url="", paths=paths)
    assert sorted(crawler.spider.ok) == sorted(paths)
    banned_at = next(t for t, path, client in banning.log() if client == "127.0.0.2")
    after = [client for t, path, client in other.log() if t > banned_at]
    assert "127.0.0.2" in after, after  # before: only 127.0.0.3 once the ban was seen
    assert "127.0.0.2" not in [c for t, _, c in banning.log() if t > banned_at]
    shared = redis_client.hgetall(Keys("ha", "faults").proxy_cooldowns)
    assert list(shared) == [f"127.0.0.1:{proxies[0].port} 127.0.0.1".encode()]


@deferred_f_from_coro_f
async def test_a_429_in_a_pool_closes_its_domain_and_cools_no_proxy_for_every_site(
    redis_url, redis_client, site_factory, proxy_factory
):
    """A 429 cooled its pool proxy for every site for HA_PROXY_COOLDOWN (300 s): a QA run's
    two 429s of one host, with Retry-After 1, left no proxy for any host for a minute. The
    site's wait is its domain's gate; the proxy stays in rotation for the others."""
    proxies = [proxy_factory("--no-auth", "--exits", "1", "--first-exit", str(n)) for n in (2, 3)]
    site = site_factory("--proxy-list", ",".join(f"127.0.0.1:{p.port}" for p in proxies))
    paths = ("/flaky/1?fail=1&status=429&retry_after=1", *(f"/item/{i}" for i in range(2, 12)))
    crawler = pool_crawler(redis_url, site, CONCURRENT_REQUESTS=1, HA_PROXY_COOLDOWN=600)
    await crawler.crawl_async(base_url=site.url, paths=paths)
    assert sorted(crawler.spider.ok) == sorted(paths)
    assert redis_client.hgetall(Keys("ha", "faults").proxy_cooldowns) == {}
    stats = crawler.stats.get_stats()
    assert "ha/proxy/rotations" not in stats and "ha/proxy/unavailable" not in stats
    assert stats["ha/retry/rate_limited"] == 1


@deferred_f_from_coro_f
async def test_an_exhausted_pool_is_kept_until_its_ttl_and_falls_back_only_if_allowed(
    redis_url, redis_client, site_factory, proxy_factory
):
    proxy = proxy_factory("--no-auth", "--exits", "1", "--first-exit", "2")
    site = site_factory("--ban-exit", "127.0.0.2", "--proxy-list", f"127.0.0.1:{proxy.port}")
    paths = ("/item/1", "/item/2")
    crawler = pool_crawler(redis_url, site, HA_PROXY_ALLOW_DIRECT=True, CONCURRENT_REQUESTS=1)
    await crawler.crawl_async(base_url=site.url, paths=paths)
    assert sorted(crawler.spider.ok) == sorted(paths)
    assert crawler.stats.get_value("ha/proxy/direct") >= 1
    fetches = [path for _, path, _ in site.log() if path == "/proxies.json"]
    assert len(fetches) == 1  # not fetched again before its TTL (30 s): the API is spared


@deferred_f_from_coro_f
async def test_without_a_session_template_an_https_ban_is_no_rotation(
    redis_url, site_factory, proxy_factory, caplog
):
    site = site_factory("--tls", "--ban-exit", "127.0.0.2")
    proxy = proxy_factory("--user", "crawler", "--password", SECRET, "--exits", "3")
    paths = ("/item/1", "/item/2")
    crawler = get_crawler(
        FaultSpider,
        settings(
            redis_url,
            HA_PROXY_MODE="tunnel",
            HA_PROXY_URL=f"http://crawler:{SECRET}@127.0.0.1:{proxy.port}",
            CONCURRENT_REQUESTS=1,
        ),
    )
    await crawler.crawl_async(base_url=site.url, paths=paths)
    assert {client for _, _, client in site.log()} == {"127.0.0.2"}  # one tunnel, one exit
    stats = crawler.stats.get_stats()
    assert stats[f"ha/proxy/127.0.0.1:{proxy.port}/bans"] >= len(paths)
    assert "ha/proxy/rotations" not in stats  # before: one per ban, nothing had changed
    assert "Rotating" not in caplog.text
    assert caplog.text.count("Set HA_PROXY_SESSION_TEMPLATE") == 1


@deferred_f_from_coro_f
async def test_the_rotation_header_goes_with_one_plain_http_attempt_only():
    from scrapy import Request
    from scrapy.http import HtmlResponse

    from scrapy_ha.codec import decode_request, encode_request
    from scrapy_ha.middlewares.proxy import ProxyMiddleware

    crawler = get_crawler(
        FaultSpider,
        {
            "HA_PROXY_MODE": "tunnel",
            "HA_PROXY_URL": "http://u:pw@127.0.0.1:3128",
            "HA_PROXY_SESSION_TEMPLATE": "{user}-session-{session}",
            "HA_PROXY_ROTATE_HEADER": "X-Rotate-Exit: 1",
        },
    )
    crawler.stats.open_spider()
    spider = FaultSpider()
    mw = ProxyMiddleware.from_crawler(crawler)

    async def attempt(url: str) -> Request:
        request = Request(url, callback=spider.parse)
        assert await mw.process_request(request) is None
        return request

    banned = await attempt("http://shop.example/a")
    mw.process_response(banned, HtmlResponse(banned.url, status=403, request=banned))
    https = await attempt("https://shop.example/b")
    assert b"X-Rotate-Exit" not in https.headers  # the site, not the proxy, would read it
    plain = await attempt("http://shop.example/c")
    assert plain.headers[b"X-Rotate-Exit"] == b"1"  # the rotation waited for plain HTTP
    mw.process_response(plain, HtmlResponse(plain.url, status=500, request=plain))
    stored = decode_request(encode_request(plain.replace(), spider), spider)  # its retry
    assert b"X-Rotate-Exit" not in stored.headers
    assert await mw.process_request(stored) is None
    assert b"X-Rotate-Exit" not in stored.headers  # one rotation, one header
