"""The proxy pool's promises through real crawls and real local proxies: a proxy that keeps
failing is taken out of rotation; a proxy one worker cooled down is skipped by the next
worker too (through Redis, not through memory); with no usable proxy and
``HA_PROXY_ALLOW_DIRECT`` off, a request waits in Redis and is never sent direct."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request
from scrapy.exceptions import DownloadTimeoutError
from scrapy.http import HtmlResponse
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler
from twisted.internet.error import ConnectionRefusedError

from scrapy_ha.keys import Keys
from scrapy_ha.middlewares.proxy import ProxyMiddleware
from tests import backqueues
from tests.spiders import FaultSpider
from tests.test_proxy import pool_crawler, settings

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

#: The address the site sees for a request sent without a proxy (the proxies' exits are
#: 127.0.0.2 and up).
DIRECT_CLIENT = "127.0.0.1"
#: Long enough that no cool-down ends during a test.
COOLDOWN = 600
#: Seconds a test waits for a crawl to reach the state it checks (a busy machine is slow).
DEADLINE = 60
KEYS = Keys("ha", "faults")


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


@pytest.fixture
def dead_proxy() -> Iterator[str]:
    """``127.0.0.1:PORT`` where nothing listens: the port is bound (so nobody else takes it)
    but never listened on, so every connection to it is refused at once."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def item_hits(site) -> list[str]:
    """The client address of every hit on an item page, in order."""
    return [client for _, path, client in site.log() if path.startswith("/item/")]


async def poll(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {DEADLINE} s"
        await asyncio.sleep(0.05)


@deferred_f_from_coro_f
async def test_a_proxy_that_keeps_failing_is_taken_out_of_rotation(
    redis_url, redis_client, site_factory, proxy_factory, dead_proxy
):
    live = proxy_factory("--no-auth", "--exits", "1", "--first-exit", "3")
    site = site_factory("--proxy-list", f"{dead_proxy},127.0.0.1:{live.port}")
    paths = tuple(f"/item/{i}" for i in range(1, 11))
    crawler = pool_crawler(
        redis_url, site, HA_PROXY_MAX_FAILURES=2, HA_PROXY_COOLDOWN=COOLDOWN, CONCURRENT_REQUESTS=1
    )
    await crawler.crawl_async(base_url=site.url, paths=paths)
    assert sorted(crawler.spider.ok) == sorted(paths)
    stats = crawler.stats.get_stats()
    # taken in turn with the live one until its second failure, then never again: without
    # the cool-down it would carry every other attempt
    assert stats[f"ha/proxy/{dead_proxy}/failures"] == 2
    assert stats[f"ha/proxy/{dead_proxy}/requests"] == 2
    assert stats["ha/proxy/rotations"] == 1
    assert set(item_hits(site)) == {"127.0.0.3"}
    assert list(redis_client.hgetall(KEYS.proxy_cooldowns)) == [dead_proxy.encode()]


@deferred_f_from_coro_f
async def test_a_second_worker_skips_a_proxy_the_first_cooled_down(
    redis_url, redis_client, site_factory, proxy_factory
):
    banned = proxy_factory("--no-auth", "--exits", "1", "--first-exit", "2")
    good = proxy_factory("--no-auth", "--exits", "1", "--first-exit", "3")
    pool = f"127.0.0.1:{banned.port},127.0.0.1:{good.port}"
    site = site_factory("--ban-exit", "127.0.0.2", "--proxy-list", pool)

    def worker():
        return pool_crawler(redis_url, site, HA_PROXY_COOLDOWN=COOLDOWN, CONCURRENT_REQUESTS=1)

    first = worker()
    await first.crawl_async(base_url=site.url, paths=("/item/1", "/item/2"))
    assert item_hits(site)[0] == "127.0.0.2"  # the first worker's first try was banned
    await poll(
        lambda: redis_client.hexists(KEYS.proxy_cooldowns, f"127.0.0.1:{banned.port} 127.0.0.1"),
        "the first worker shared its cool-down",
    )
    hits_before = len(item_hits(site))

    second = worker()  # a worker of its own: it knows of the ban only through Redis
    paths = tuple(f"/item/{i}" for i in range(3, 9))
    await second.crawl_async(base_url=site.url, paths=paths)
    assert sorted(second.spider.ok) == sorted(paths)
    # its pool lists the banned proxy first: without the shared cool-down its first
    # request would go there and be banned
    assert set(item_hits(site)[hits_before:]) == {"127.0.0.3"}
    stats = second.stats.get_stats()
    assert f"ha/proxy/127.0.0.1:{banned.port}/requests" not in stats
    assert "ha/retry/banned" not in stats


@deferred_f_from_coro_f
async def test_with_no_usable_proxy_a_request_waits_and_is_never_sent_direct(
    redis_url, redis_client, site_factory, proxy_factory
):
    proxy = proxy_factory("--no-auth", "--exits", "1", "--first-exit", "2")
    site = site_factory("--ban-exit", "127.0.0.2", "--proxy-list", f"127.0.0.1:{proxy.port}")
    paths = ("/item/1", "/item/2")
    crawler = get_crawler(
        FaultSpider,
        settings(
            redis_url,
            HA_PROXY_MODE="pool",
            HA_PROXY_POOL_URL=site.url + "/proxies.json",
            HA_PROXY_COOLDOWN=COOLDOWN,
            CONCURRENT_REQUESTS=1,
        ),  # HA_PROXY_ALLOW_DIRECT is off by default
    )
    crawling = asyncio.ensure_future(crawler.crawl_async(base_url=site.url, paths=paths))
    try:
        # the only proxy is banned on its first request; then neither request has a proxy
        # (a crawl that sent them direct finishes instead: the checks below say so)
        await poll(
            lambda: crawling.done() or redis_client.zcard(KEYS.delayed) == len(paths),
            "both requests wait in the delayed set",
        )
    finally:
        if not crawling.done():
            await crawler.stop_async()
        await crawling
    assert item_hits(site) == ["127.0.0.2"]  # the one banned try; nothing went direct
    assert DIRECT_CLIENT not in item_hits(site)
    stats = crawler.stats.get_stats()
    # the second found no proxy; the first went to the delayed set as a banned try, and is
    # refused a proxy again only if its retry comes due before the crawl is stopped
    assert stats["ha/proxy/unavailable"] >= 1
    assert "ha/proxy/direct" not in stats
    assert crawler.spider.ok == [] and crawler.spider.errors == []
    kept = backqueues.count(redis_client, KEYS) + sum(
        redis_client.zcard(k) for k in (KEYS.leased, KEYS.delayed)
    )
    assert kept == len(paths) and redis_client.zcard(KEYS.dead) == 0
    # a wait for a proxy is no retry: it was counted as one crawl-wide (a QA run read
    # "retried 120 (no_proxy 118)" and "retry success 100%" for 2 retries), per domain too
    counters = redis_client.hgetall(KEYS.stats)
    assert counters[b"retried"] == b"1" and b"retried:no_proxy" not in counters, counters
    assert redis_client.hlen(KEYS.retried) == 1  # (the retried ids: retry_ok, retry_dead)
    assert redis_client.hget(KEYS.held, "#proxy 127.0.0.1") is not None
    assert stats.get("ha/retry/delayed", 0) <= 1 and stats["ha/proxy/waits"] >= 1


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
@deferred_f_from_coro_f
async def test_a_pool_proxy_answering_407_is_cooled_down_and_the_crawl_goes_on(
    tls, redis_url, redis_client, site_factory, proxy_factory, caplog
):
    foreign = proxy_factory("--user", "someone", "--password", "else", "--first-exit", "2")
    good = proxy_factory("--no-auth", "--exits", "1", "--first-exit", "3")
    pool = f"127.0.0.1:{foreign.port},127.0.0.1:{good.port}"
    api = site_factory("--proxy-list", pool)
    site = site_factory("--tls") if tls else api
    paths = tuple(f"/item/{i}" for i in range(1, 11))
    crawler = get_crawler(
        FaultSpider,
        settings(
            redis_url,
            HA_PROXY_MODE="pool",
            HA_PROXY_POOL_URL=api.url + "/proxies.json",
            HA_PROXY_COOLDOWN=COOLDOWN,
            CONCURRENT_REQUESTS=2,
        ),
    )
    await crawler.crawl_async(base_url=site.url, paths=paths)
    stats = crawler.stats.get_stats()
    assert stats["finish_reason"] == "finished"  # before: proxy_auth_failed, 1 item of 10
    assert sorted(crawler.spider.ok) == sorted(paths)
    assert stats[f"ha/proxy/127.0.0.1:{foreign.port}/auth_failures"] >= 1
    assert "ha/proxy/auth_failed" not in stats and "ha/dead/count" not in stats
    assert set(item_hits(site)) == {"127.0.0.3"}
    shared = redis_client.hgetall(KEYS.proxy_cooldowns)
    assert list(shared) == [f"127.0.0.1:{foreign.port}".encode()]
    assert "HA_PROXY_USER" not in caplog.text and "HA_PROXY_URL" not in caplog.text


@deferred_f_from_coro_f
async def test_the_crawl_stops_when_every_pool_proxy_answers_407(
    redis_url, redis_client, site_factory, proxy_factory, caplog
):
    foreign = [proxy_factory("--user", "someone", "--password", "else") for _ in range(2)]
    site = site_factory("--proxy-list", ",".join(f"127.0.0.1:{p.port}" for p in foreign))
    paths = tuple(f"/item/{i}" for i in range(1, 11))
    crawler = pool_crawler(redis_url, site, CONCURRENT_REQUESTS=1)
    await crawler.crawl_async(base_url=site.url, paths=paths)
    assert crawler.stats.get_value("finish_reason") == "proxy_auth_failed"
    assert caplog.text.count("Every proxy of the pool") == 1
    assert "HA_PROXY_POOL_URL" in caplog.text and "HA_PROXY_USER" not in caplog.text
    assert item_hits(site) == [] and redis_client.zcard(KEYS.dead) == 0


@deferred_f_from_coro_f
async def test_max_failures_counts_failures_in_a_row(site_factory):
    """HA_PROXY_MAX_FAILURES=2: two failures with 98 successes between them are no two
    failures in a row (the middleware's hooks, called as the downloader calls them)."""
    mw = pool_middleware(site_factory("--proxy-list", "127.0.0.1:1111,127.0.0.1:2222"))
    used = []
    for n in range(200):
        request = Request(f"http://shop.example/{n}")
        assert await mw.process_request(request) is None
        used.append(request.meta["ha_proxy"])
        if request.meta["ha_proxy"] == "127.0.0.1:1111" and n in (0, 100):
            mw.process_exception(request, ConnectionRefusedError())
        else:
            ok = HtmlResponse(request.url, status=200, body=b"ok", request=request)
            mw.process_response(request, ok)
    assert mw.pool.cooling == {}  # before: 1111 cooled down at its second failure
    assert set(used[-20:]) == {"127.0.0.1:1111", "127.0.0.1:2222"}
    assert mw.stats.get_value("ha/proxy/rotations") is None


def pool_middleware(site: Any) -> ProxyMiddleware:
    """A pool middleware of the proxies *site* lists (``HA_PROXY_MAX_FAILURES=2``), called
    as the downloader calls it."""
    crawler = get_crawler(
        FaultSpider,
        {
            "HA_PROXY_MODE": "pool",
            "HA_PROXY_POOL_URL": site.url + "/proxies.json",
            "HA_PROXY_MAX_FAILURES": 2,
        },
    )
    crawler.stats.open_spider()
    return ProxyMiddleware.from_crawler(crawler)


async def time_out(mw: ProxyMiddleware, url: str) -> str | None:
    """One attempt at *url* that times out; the proxy it went through (None: none usable)."""
    request = Request(url)
    if await mw.process_request(request) is not None:
        return None
    mw.process_exception(request, DownloadTimeoutError(f"Getting {url} took too long"))
    return str(request.meta["ha_proxy"])


@deferred_f_from_coro_f
async def test_timeouts_at_one_site_take_the_proxy_from_that_site_alone(site_factory):
    """A site that holds its answers back (a tarpit) times out through every proxy: two
    timeouts there in a row took each proxy out for every site in turn (a QA run: three
    healthy sites left without a proxy for HA_PROXY_COOLDOWN). A proxy that times out at
    two sites in a row is the one that hangs: out for every site, as before."""
    site = site_factory("--proxy-list", "127.0.0.1:1111,127.0.0.1:2222")
    mw = pool_middleware(site)
    for _ in range(20):
        if await time_out(mw, "http://tarpit.example/page") is None:
            break  # every proxy out for the tarpit
    assert mw.pool is not None
    tarpit = {"127.0.0.1:1111 tarpit.example", "127.0.0.1:2222 tarpit.example"}
    assert set(mw.pool.cooling) == tarpit, mw.pool.cooling
    healthy = Request("http://shop.example/1")
    assert await mw.process_request(healthy) is None and "ha_proxy" in healthy.meta

    hung = pool_middleware(site_factory("--proxy-list", "127.0.0.1:3333"))
    assert await time_out(hung, "http://a.example/1") == "127.0.0.1:3333"
    assert await time_out(hung, "http://b.example/1") == "127.0.0.1:3333"
    assert hung.pool is not None and set(hung.pool.cooling) == {"127.0.0.1:3333"}


@deferred_f_from_coro_f
async def test_a_407_a_proxy_got_over_does_not_count_towards_stopping_the_crawl(site_factory):
    """Review of the pool's 407 rule: a proxy that answered 407 once and served pages since
    stayed refused for the crawl's life, so one passing 407 per proxy, over a long crawl,
    stopped it (the middleware's hooks, called as the downloader calls them)."""
    site = site_factory("--proxy-list", "127.0.0.1:1111,127.0.0.1:2222")
    settings_ = {"HA_PROXY_MODE": "pool", "HA_PROXY_POOL_URL": site.url + "/proxies.json"}
    crawler = get_crawler(FaultSpider, {**settings_, "HA_PROXY_COOLDOWN": 0.001})
    crawler.stats.open_spider()
    mw = ProxyMiddleware.from_crawler(crawler)
    mw._stop_crawl = lambda: pytest.fail("the crawl was stopped")  # type: ignore[method-assign]
    # 1111 answers 407 once, then serves pages; only then does 2222 answer its one 407
    refused, served = [], set()
    for n in range(200):
        request = Request(f"http://shop.example/{n}")
        assert await mw.process_request(request) is None
        pid = request.meta["ha_proxy"]
        turn = "127.0.0.1:1111" if not refused else "127.0.0.1:2222"
        once = pid == turn and pid not in refused and (not refused or refused[0] in served)
        if once:
            refused.append(pid)
        elif pid in refused:
            served.add(pid)
        status = 407 if once else 200
        mw.process_response(request, HtmlResponse(request.url, status=status, request=request))
        await asyncio.sleep(0.002)  # past the cool-down
    assert refused == ["127.0.0.1:1111", "127.0.0.1:2222"]


@deferred_f_from_coro_f
async def test_a_sharded_crawl_keeps_its_waits_for_a_proxy_in_its_shards(
    redis_url, redis_client, site_factory, proxy_factory
):
    """The same waits in a crawl of 2 shards: each entry waits in its own shard's delayed
    set, marked as waiting for a proxy (a wait's call to the shards' queue must carry it)."""
    proxy = proxy_factory("--no-auth", "--exits", "1", "--first-exit", "2")
    site = site_factory("--ban-exit", "127.0.0.2", "--proxy-list", f"127.0.0.1:{proxy.port}")
    paths = tuple(f"/item/{i}" for i in range(1, 7))
    more = {"HA_PROXY_COOLDOWN": COOLDOWN, "HA_SHARDS": 2, "CONCURRENT_REQUESTS": 1}
    crawler = pool_crawler(redis_url, site, **more)
    shards = [KEYS.of_shard(i) for i in range(2)]
    crawling = asyncio.ensure_future(crawler.crawl_async(base_url=site.url, paths=paths))
    try:
        await poll(
            lambda: (
                crawling.done() or sum(redis_client.zcard(k.delayed) for k in shards) == len(paths)
            ),
            "every request waits in a delayed set",
        )
    finally:
        if not crawling.done():
            await crawler.stop_async()
        await crawling
    stats = crawler.stats.get_stats()
    assert "ha/op_errors" not in stats and stats["ha/proxy/waits"] >= len(paths) - 1
    marked = sum(int(redis_client.hget(k.held, "#proxy 127.0.0.1") or 0) for k in shards)
    assert marked >= len(paths) - 1  # (the banned one is a retry)
    assert all(redis_client.zcard(k.dead) == 0 for k in shards)


@deferred_f_from_coro_f
async def test_one_error_while_a_site_has_no_usable_proxy_and_others_go_on(tmp_path, caplog):
    """A site that banned every proxy of the pool logs one ERROR, not one per request while
    the other sites' requests get proxies (before: each of those reset the warning, and
    the banned site's requests logged an ERROR each, 8 in one second of a real crawl)."""
    pool = tmp_path / "pool.json"
    pool.write_text('["127.0.0.1:1111"]')
    crawler = get_crawler(
        FaultSpider, {"HA_PROXY_MODE": "pool", "HA_PROXY_POOL_URL": pool.as_uri()}
    )
    crawler.stats.open_spider()
    mw = ProxyMiddleware.from_crawler(crawler)
    ban = Request("http://banned.example/0")
    assert await mw.process_request(ban) is None
    mw.process_response(ban, HtmlResponse(ban.url, status=403, body=b"no", request=ban))
    for n in range(5):  # the banned site and another, in turns
        assert await mw.process_request(Request(f"http://banned.example/{n}")) is not None
        assert await mw.process_request(Request(f"http://fine.example/{n}")) is None
    assert caplog.text.count("No usable proxy") == 1
    assert crawler.stats.get_value("ha/proxy/unavailable") == 5
    mw.pool.cooling.clear()  # its cool-down over: the banned site has a proxy again
    assert await mw.process_request(Request("http://banned.example/again")) is None
    mw.pool.cool_down("127.0.0.1:1111", "banned.example")
    assert await mw.process_request(Request("http://banned.example/later")) is not None
    assert caplog.text.count("No usable proxy") == 2  # a new run is told


@deferred_f_from_coro_f
async def test_answers_on_their_way_take_a_proxy_out_once(tmp_path, caplog):
    """Requests in flight through a proxy when it is taken out (for a site's ban, or for
    failing) count one rotation, one INFO line and one shared cool-down, not one each
    (before: a hanging proxy's 16 timeouts in a real crawl counted 8 rotations, logged 8
    times in the same second; a site's 5 bans on requests in flight, 5)."""
    pool = tmp_path / "pool.json"
    pool.write_text('["127.0.0.1:1111", "127.0.0.1:2222"]')
    crawler = get_crawler(
        FaultSpider,
        {"HA_PROXY_MODE": "pool", "HA_PROXY_POOL_URL": pool.as_uri(), "HA_PROXY_MAX_FAILURES": 2},
    )
    crawler.stats.open_spider()
    mw = ProxyMiddleware.from_crawler(crawler)
    flight = []
    for n in range(16):  # taken in turns: 8 on their way through each proxy
        request = Request(f"http://{'shop' if n < 8 else 'news'}.example/{n}")
        assert await mw.process_request(request) is None
        flight.append(request)
    through = [r for r in flight if r.meta["ha_proxy"] == "127.0.0.1:1111"]
    with caplog.at_level(logging.INFO):
        for request in through[:4]:  # shop.example bans it: out for that site
            mw.process_response(request, HtmlResponse(request.url, status=403, request=request))
        for request in through[4:]:  # it times out: out for every site
            mw.process_exception(request, ConnectionRefusedError())
    assert crawler.stats.get_value("ha/proxy/127.0.0.1:1111/bans") == 4
    assert crawler.stats.get_value("ha/proxy/127.0.0.1:1111/failures") == 4
    assert crawler.stats.get_value("ha/proxy/rotations") == 2
    assert caplog.text.count("out of rotation for shop.example") == 1
    assert caplog.text.count("out of rotation for every site") == 1
    assert set(mw.pool.cooling) == {"127.0.0.1:1111 shop.example", "127.0.0.1:1111"}
    assert mw.pool.failures == {}  # back from its cool-down with no failure counted


@deferred_f_from_coro_f
async def test_a_proxy_that_times_out_at_one_site_then_another_is_out_for_every_site(
    site_factory,
):
    """A dead proxy (its address drops packets: Scrapy says DownloadTimeoutError, as for a
    tarpit) in a crawl whose requests come a site at a time: HA_PROXY_MAX_FAILURES timeouts
    at one site cooled it for that site alone, then as many at the next site for that one,
    and so on: with no answer between, it stayed in rotation for every site it had not yet
    timed out at, each costing a full download timeout per attempt. A row of timeouts at
    two sites is the proxy's, whether or not one site's part cooled it there first."""
    hung = pool_middleware(site_factory("--proxy-list", "127.0.0.1:3333"))
    for url in ("http://a.example/1", "http://a.example/2", "http://b.example/1"):
        assert await time_out(hung, url) == "127.0.0.1:3333"
    assert hung.pool is not None and "127.0.0.1:3333" in hung.pool.cooling, hung.pool.cooling
    assert await time_out(hung, "http://c.example/1") is None  # out for every site


@deferred_f_from_coro_f
async def test_entries_of_one_gateway_with_their_own_user_names_are_proxies_of_their_own(
    site_factory,
):
    """A gateway's sessions listed as proxies of their own (``user-session-a@gw:port``,
    ``user-session-b@gw:port``, as providers list them) were one proxy, ``gw:port``: a ban
    through one took every other out of rotation with it. Their ids hold a digest of the
    user name, never the name: some providers' user name is the secret itself
    (``http://TOKEN:@gw:port``)."""
    entries = ["http://s3cr3t-a:pw@127.0.0.1:1111", "http://s3cr3t-b:@127.0.0.1:1111"]
    mw = pool_middleware(site_factory("--proxy-json", json.dumps(entries)))
    first = Request("http://shop.example/1")
    assert await mw.process_request(first) is None
    assert mw.pool is not None
    banned = first.meta["ha_proxy"]
    assert banned.endswith("@127.0.0.1:1111") and "s3cr3t" not in banned, banned
    mw.pool.cool_down(banned, "shop.example")
    for n in range(4):  # the other session serves the site meanwhile
        request = Request(f"http://shop.example/{n + 2}")
        assert await mw.process_request(request) is None
        assert request.meta["ha_proxy"] not in (None, banned), request.meta
    said = " ".join(str(k) for k in mw.stats.get_stats())
    assert "s3cr3t" not in said, said


@deferred_f_from_coro_f
async def test_a_cool_down_of_a_gateway_by_a_worker_of_an_earlier_version_holds(site_factory):
    """Workers of an earlier version name every entry of a gateway ``host:port``: their
    cool-down of it (merged from Redis) holds for each of its sessions, as it did."""
    entries = ["http://cust-a:pw@127.0.0.1:1111", "http://cust-b:pw@127.0.0.1:1111"]
    mw = pool_middleware(site_factory("--proxy-json", json.dumps(entries)))
    assert await mw.process_request(Request("http://shop.example/1")) is None
    assert mw.pool is not None
    mw.pool.cooling["127.0.0.1:1111 shop.example"] = time.time() + 60
    assert await mw.process_request(Request("http://shop.example/2")) is not None  # waits
    other = Request("http://other.example/1")
    assert await mw.process_request(other) is None and "ha_proxy" in other.meta
