"""The proxy middleware under failures: a proxy authentication failure is read from the
status, never from text; a Redis error while choosing a proxy keeps the request; the shared
cool-downs are scored by the Redis server's clock and pruned; local state is bounded."""

from __future__ import annotations

import time

import pytest
from scrapy import Request, signals
from scrapy.core.downloader.handlers.http11 import TunnelError
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler
from twisted.internet.error import ConnectionRefusedError, DNSLookupError

from scrapy_ha.keys import Keys
from scrapy_ha.middlewares.proxy import MAX_PROXY_STATS, ProxyMiddleware, tunnel_status
from scrapy_ha.middlewares.proxy_sources import ProxyPool
from tests.spiders import FaultSpider
from tests.test_proxy import pool_crawler, settings

#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


def tunnel_error(port: int, status: int) -> TunnelError:
    """Worded as Scrapy's HTTP/1.1 handler words it."""
    extra = {"status": status, "reason": "Whatever"}
    return TunnelError(f"Could not open CONNECT tunnel with proxy 127.0.0.1:{port} [{extra!r}]")


def tunnel_middleware(port: int) -> ProxyMiddleware:
    crawler = get_crawler(
        FaultSpider, {"HA_PROXY_MODE": "tunnel", "HA_PROXY_URL": f"http://u:p@127.0.0.1:{port}"}
    )
    crawler.stats.open_spider()
    return ProxyMiddleware.from_crawler(crawler)


@pytest.mark.parametrize(
    "exception",
    [
        DNSLookupError("shop407.example.com: no such host"),
        ConnectionRefusedError("127.0.0.1:40712"),
        tunnel_error(40712, 502),
        tunnel_error(4070, 403),
    ],
    ids=["dns-shop407", "refused-port-40712", "tunnel-502-port-40712", "tunnel-403-port-4070"],
)
def test_a_407_in_the_error_text_is_no_authentication_failure(exception):
    mw = tunnel_middleware(40712)
    request = Request("http://shop407.example.com/", meta={"ha_proxy": "127.0.0.1:40712"})
    assert mw.process_exception(request, exception) is None
    assert mw.stats.get_value("ha/proxy/auth_failed") is None


def test_a_connect_answered_407_is_read_from_the_tunnel_status():
    # the whole path (HTTP 407 and CONNECT 407 from the demo proxy) is
    # tests/test_proxy.py::test_407_stops_the_crawl_once_and_keeps_the_requests
    assert tunnel_status(tunnel_error(8080, 407)) == 407
    assert tunnel_status(tunnel_error(40712, 200 + 207)) == 407
    assert tunnel_status(ValueError("[{'status': 407, 'reason': 'x'}]")) is None


@deferred_f_from_coro_f
async def test_a_redis_error_in_the_proxy_pool_keeps_every_request(
    redis_url, redis_client, site_factory, proxy_factory
):
    proxy = proxy_factory("--no-auth", "--exits", "1", "--first-exit", "2")
    site = site_factory("--proxy-list", f"127.0.0.1:{proxy.port}")
    paths = tuple(f"/item/{i}" for i in range(1, 11))
    crawler = pool_crawler(redis_url, site, HA_PROXY_POOL_TTL=0, LOG_LEVEL="INFO")

    def spoil(**_: object) -> None:
        # the shared cool-downs unreadable (a Redis error on every read: WRONGTYPE), once
        # the worker has started (its start sets aside keys of another type it finds)
        redis_client.set(Keys("ha", "faults").proxy_cooldowns, "not a hash")

    crawler.signals.connect(spoil, signal=signals.response_received)
    await crawler.crawl_async(base_url=site.url, paths=paths)
    assert sorted(crawler.spider.ok) == sorted(paths)
    assert crawler.stats.get_value("ha/proxy/redis_errors") >= 1


@deferred_f_from_coro_f
async def test_shared_cooldowns_use_the_server_clock_and_are_pruned(redis_url, redis_client, site):
    crawler = pool_crawler(redis_url, site, HA_PROXY_COOLDOWN=60)
    await crawler.crawl_async(base_url=site.url, paths=())  # opens the scheduler, then closes
    from scrapy_ha.scheduler.shell import Scheduler

    scheduler = Scheduler.from_crawler(crawler)
    crawler.spider = FaultSpider(base_url=site.url)
    await scheduler._open(crawler.spider)
    try:
        mw = ProxyMiddleware.from_crawler(crawler)
        key = scheduler.queue.keys.proxy_cooldowns
        server_ms = int(redis_client.time()[0] * 1000)
        redis_client.hset(key, mapping={"old:1": server_ms - 1000, "bad:2": "garbage"})
        await mw.shared.share("new:3")
        stored = int(redis_client.hget(key, "new:3"))
        assert abs(stored - (server_ms + 60_000)) < 2000  # the server's clock
        assert 0 < redis_client.pttl(key) <= 60_000  # gone with its newest cool-down
        cooling = await mw.shared.load()
        assert list(cooling) == ["new:3"] and 55 < cooling["new:3"] - time.time() <= 61
        assert set(redis_client.hgetall(key)) == {b"new:3"}  # expired and garbage pruned
    finally:
        scheduler.session.stopping = True
        await scheduler.session.close("test")


def test_local_proxy_state_is_bounded():
    crawler = get_crawler(FaultSpider, {"HA_PROXY_MODE": "pool", "HA_PROXY_POOL_URL": "http://x/"})
    crawler.stats.open_spider()
    mw = ProxyMiddleware.from_crawler(crawler)
    for n in range(MAX_PROXY_STATS * 3):
        mw._stat(f"10.0.{n // 250}.{n % 250}:80", "requests")
    per_proxy = [k for k in crawler.stats.get_stats() if k.startswith("ha/proxy/")]
    assert len(per_proxy) == MAX_PROXY_STATS + 1  # and "other"
    assert crawler.stats.get_value("ha/proxy/other/requests") == MAX_PROXY_STATS * 2
    pool = ProxyPool(mw.config)
    pool.proxies = ["http://10.0.0.1:80"]
    pool.cooling = {"10.0.0.1:80": time.time() + 60, "10.9.9.9:80": time.time() - 1}
    pool.failures = {"10.0.0.1:80": 1, "10.9.9.9:80": 1}
    pool._prune()
    assert list(pool.cooling) == ["10.0.0.1:80"] and list(pool.failures) == ["10.0.0.1:80"]
    # a proxy sent to cool down comes back with no failure counted: one more failure after
    # its cool-down would take it out at once (HA_PROXY_MAX_FAILURES in a row)
    pool.cool_down("10.0.0.1:80")
    assert "10.0.0.1:80" not in pool.failures


@deferred_f_from_coro_f
async def test_redis_stopped_while_the_pool_chooses_proxies_loses_nothing(
    tmp_path, site_factory, proxy_factory, monkeypatch
):
    """Redis stops between the pool's fetch of the list and its read of the shared
    cool-downs (stopped from the fetch itself: a timed outage could fall while no request
    needs a proxy, and the pool would never meet it)."""
    import asyncio

    from tests.conftest import RedisServer
    from tests.spiders import CatalogueSpider

    server = RedisServer(tmp_path / "redis", appendonly=True)
    server.start()
    proxy = proxy_factory("--no-auth", "--exits", "1", "--first-exit", "2")
    site = site_factory(
        "--pages",
        "10",
        "--per-page",
        "10",
        "--delay",
        "0.02",
        "--proxy-list",
        f"127.0.0.1:{proxy.port}",
    )
    crawler = get_crawler(
        CatalogueSpider,
        settings(
            server.url,
            HA_PROXY_MODE="pool",
            HA_PROXY_POOL_URL=site.url + "/proxies.json",
            HA_PROXY_POOL_TTL=0,
            CONCURRENT_REQUESTS=4,
            LOG_LEVEL="INFO",
        ),
    )
    stopped = asyncio.Event()
    fetched = ProxyPool._fetched

    def fetched_then_stop(pool: ProxyPool, entries: list[object]) -> None:
        fetched(pool, entries)
        if not stopped.is_set() and crawler.spider and len(crawler.spider.items) >= 20:
            server.stop()  # graceful: the AOF is written; the cool-downs' read comes next
            stopped.set()

    monkeypatch.setattr(ProxyPool, "_fetched", fetched_then_stop)
    crawling = asyncio.ensure_future(crawler.crawl_async(base_url=site.url))
    try:
        while not crawler.stats.get_value("ha/proxy/redis_errors"):
            assert not crawling.done(), "the crawl ended before Redis stopped"
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.5)  # the scheduler meets the outage too
        server.start()  # same port, same data
        await crawling
    finally:
        server.stop()
    assert crawler.stats.get_value("ha/proxy/redis_errors", 0) >= 1
    assert sorted(i["id"] for i in crawler.spider.items) == list(range(1, 101))


@deferred_f_from_coro_f
async def test_a_cool_down_written_while_another_worker_loads_is_kept(redis_url, redis_client):
    """Worker A reads the cool-downs while worker B cools the same proxy down again: A must
    not delete B's fresh cool-down as the expired one it read."""
    import redis.asyncio

    from scrapy_ha.store.state import ProxyCooldowns

    keys = Keys("ha", "faults")
    server_ms = int(redis_client.time()[0] * 1000)
    redis_client.hset(keys.proxy_cooldowns, "10.0.0.1:80", server_ms - 1000)  # over

    class WorkerA(redis.asyncio.Redis):
        async def hgetall(self, name):  # B writes right after A's read (real Redis, both)
            read = await super().hgetall(name)
            redis_client.hset(keys.proxy_cooldowns, "10.0.0.1:80", server_ms + 60_000)
            return read

        async def evalsha(self, sha, numkeys, *args):  # the same instant, before one script
            redis_client.hset(keys.proxy_cooldowns, "10.0.0.1:80", server_ms + 60_000)
            return await super().evalsha(sha, numkeys, *args)

    client = WorkerA.from_url(redis_url)
    try:
        await ProxyCooldowns(client, keys).load(server_ms)
    finally:
        await client.aclose()
    # before: A's HDEL of what it read deleted B's fresh cool-down
    assert int(redis_client.hget(keys.proxy_cooldowns, "10.0.0.1:80")) == server_ms + 60_000


def broken_ban_check(response: object) -> bool:
    raise ValueError("the ban check broke")


@pytest.mark.parametrize("mode", ["pool", "tunnel"])
def test_a_ban_check_that_raises_behind_a_proxy_dead_letters_the_request(mode, tmp_path):
    """HA_BAN_CHECK raising with a proxy configured: before, the proxy middleware's
    process_response raised, Scrapy logged "Error downloading" and the request was acked,
    lost (a real crawl: 3 such pages acked, no item, no dead letter; without a proxy the
    same pages were dead-lettered as `error`). Now the retry middleware judges it as
    docs/reference.md says: dead-lettered as `error`, never acked."""
    from scrapy.exceptions import IgnoreRequest  # noqa: PLC0415
    from scrapy.http import HtmlResponse  # noqa: PLC0415

    from scrapy_ha.middlewares.retry import RetryMiddleware  # noqa: PLC0415

    pool = tmp_path / "pool.json"
    pool.write_text('["127.0.0.1:1111"]')
    tunnel = {"HA_PROXY_URL": "http://u:p@127.0.0.1:1111"}
    where = {"HA_PROXY_POOL_URL": pool.as_uri()} if mode == "pool" else tunnel
    crawler = get_crawler(
        FaultSpider,
        {"HA_PROXY_MODE": mode, "HA_BAN_CHECK": f"{__name__}.broken_ban_check", **where},
    )
    crawler.stats.open_spider()
    proxy, retry = ProxyMiddleware.from_crawler(crawler), RetryMiddleware.from_crawler(crawler)
    request = Request("http://shop.example/1", meta={"ha_proxy": "127.0.0.1:1111"})
    answer = HtmlResponse(request.url, status=200, body=b"a page", request=request)
    assert proxy.process_response(request, answer) is answer  # as the downloader calls them
    with pytest.raises(IgnoreRequest):
        retry.process_response(request, answer)
    verdict = request.meta["ha_outcome"]
    assert (verdict["op"], verdict["class"]) == ("dead", "error")
    assert "the ban check broke" in verdict["reason"]
