"""What one worker's cookie changes do to the jar every worker shares: the middleware of two
workers against a real Redis, with the responses a site sends."""

from __future__ import annotations

import asyncio
import json
import time
from http.cookiejar import Cookie
from typing import Any

import redis.asyncio
from scrapy import Request
from scrapy.http import HtmlResponse
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.keys import Keys
from scrapy_ha.middlewares.cookies import SharedCookiesMiddleware, SharedJars, cookie_to_dict
from scrapy_ha.store import jars as jars_module

LOGOUT = "session=; Path=/; Expires=Thu, 01 Jan 1970 00:00:00 GMT"


class Stats:
    def __init__(self) -> None:
        self.values: dict[str, int] = {}

    def inc_value(self, key: str, count: int = 1) -> None:
        self.values[key] = self.values.get(key, 0) + count


async def _request(mw: SharedCookiesMiddleware, request: Request) -> Request:
    done = mw.process_request(request)
    if done is not None:
        await done
    return request


async def _respond(mw: SharedCookiesMiddleware, request: Request, set_cookie: str) -> Request:
    await _request(mw, request)
    response = HtmlResponse(request.url, request=request, headers={"Set-Cookie": set_cookie})
    done: Any = mw.process_response(request, response)
    if asyncio.iscoroutine(done):
        await done
    return request


class Workers:
    """Middlewares of workers of one crawl, each with its own Redis connection."""

    def __init__(self, redis_url: str, keys: Keys) -> None:
        self.redis_url = redis_url
        self.keys = keys
        self.clients: list[redis.asyncio.Redis] = []

    def new(self, stats: Stats | None = None) -> SharedCookiesMiddleware:
        client = redis.asyncio.Redis.from_url(self.redis_url)
        self.clients.append(client)
        mw = SharedCookiesMiddleware(shared=True)
        mw._jars = SharedJars(client, self.keys, stats)
        return mw

    async def close(self) -> None:
        for client in self.clients:
            await client.aclose()


@deferred_f_from_coro_f
async def test_a_deletion_by_a_worker_without_the_cookie_reaches_every_worker(redis_url):
    """Worker A logs in; worker B, which never loaded the jar, gets the logout's response
    (Set-Cookie with a past Expires): the next request of either sends no session (B dropped
    the deletion: the session stayed in Redis and every worker kept sending it)."""
    workers = Workers(redis_url, Keys("ha", "deletion"))
    try:
        a, b = workers.new(), workers.new()
        await _respond(a, Request("http://shop.test/login"), "session=abc; Path=/")
        logout = await _respond(b, Request("http://shop.test/logout"), LOGOUT)
        stamp = logout.meta.get("ha_cookies_v")
        assert stamp == 2, "the deletion did not change the shared jar"
        for mw in (a, b, workers.new()):
            sent = await _request(mw, Request("http://shop.test/next", meta={"ha_cookies_v": 2}))
            assert sent.headers.get("Cookie") is None
    finally:
        await workers.close()


@deferred_f_from_coro_f
async def test_a_max_age_zero_deletes_the_cookie_of_its_domain_and_path(redis_url):
    workers = Workers(redis_url, Keys("ha", "maxage"))
    try:
        a, b = workers.new(), workers.new()
        await _respond(a, Request("http://shop.test/a/login"), "sid=1; Path=/a")
        await _respond(a, Request("http://shop.test/login"), "sid=2; Path=/")
        await _respond(b, Request("http://shop.test/a/x"), "sid=; Path=/a; Max-Age=0")
        sent = await _request(a, Request("http://shop.test/a/y", meta={"ha_cookies_v": 3}))
        assert sent.headers.get("Cookie") == b"sid=2"  # only /a's went
    finally:
        await workers.close()


def _stored(name: str, expires: int | None) -> tuple[str, dict[str, Any]]:
    """A cookie as a worker stores it (every field: a worker sends what it loads)."""
    cookie = Cookie(
        0, name, "v", None, False, "shop.test", False, False, "/", True, False,
        expires, expires is None, None, None, {}, False,
    )  # fmt: skip
    return f"shop.test\t/\t{name}", cookie_to_dict(cookie)


@deferred_f_from_coro_f
async def test_expired_cookies_leave_the_shared_jar_at_the_next_merge_and_load(
    redis_url, redis_client
):
    """A broad crawl's jar grew for ever: expired cookies went only at the crawl's finish.
    A merge drops them from Redis, and a load never hands them out."""
    keys = Keys("ha", "expired")
    now = int(time.time())
    jar = dict([_stored("old", 1000), _stored("soon", now - 1), _stored("live", now + 3600)])
    jar.update([_stored("session", None)])
    redis_client.hset(keys.cookies, mapping={"jar:null": json.dumps(jar), "v:null": 4})
    workers = Workers(redis_url, keys)
    try:
        a = workers.new()
        assert a._jars is not None
        cookies, _ = await a._jars.load(None)
        assert sorted(c.name for c in cookies) == ["live", "session"]
        await _respond(a, Request("http://shop.test/cart"), "cart=1; Path=/")
    finally:
        await workers.close()
    stored = json.loads(redis_client.hget(keys.cookies, "jar:null"))
    # "soon" expired a second ago by this clock: within the hour's grace a worker's clock
    # behind the server's may still hold it (a review: Max-Age=60 on workers 120 s behind
    # was dropped at once); it is never sent
    assert sorted(c["name"] for c in stored.values()) == ["cart", "live", "session", "soon"]


@deferred_f_from_coro_f
async def test_a_deletion_of_a_cookie_no_jar_holds_changes_no_version(redis_url, redis_client):
    """A page that clears a cookie at every answer (``x=; Max-Age=0``) merged at each
    answer and bumped the jar's version: every other worker then loaded the whole jar for
    that page's requests (a review: 100 loads for 100 pages)."""
    keys = Keys("ha", "noop")
    workers = Workers(redis_url, keys)
    try:
        a = workers.new()
        await _respond(a, Request("http://shop.test/"), "id=1; Path=/")
        version = redis_client.hget(keys.cookies, "v:null")
        for n in range(3):
            await _respond(a, Request(f"http://shop.test/{n}"), "x=; Path=/; Max-Age=0")
        assert redis_client.hget(keys.cookies, "v:null") == version
    finally:
        await workers.close()


def _foreign(n: int) -> Cookie:
    domain = f".site{n}.example"
    return Cookie(0, "_ga", "x", None, False, domain, True, True, "/", True, False, None, True,
                  None, None, {}, False)  # fmt: skip


@deferred_f_from_coro_f
async def test_a_response_reads_only_the_cookies_of_its_own_domains(redis_url, monkeypatch):
    """A jar of a broad crawl holds thousands of sites' cookies: a Set-Cookie of one site
    costs the cookies of that site's domains, not two copies of the whole jar."""
    workers = Workers(redis_url, Keys("ha", "domains"))
    try:
        a = workers.new()
        await _respond(a, Request("http://site1.test/"), "id=1; Path=/")
        for n in range(2000):
            a.jars[None].jar.set_cookie(_foreign(n))
        converted: list[object] = []
        real = jars_module.cookie_to_dict

        def counted(cookie: Cookie) -> dict[str, Any]:
            converted.append(cookie)
            return real(cookie)

        monkeypatch.setattr(jars_module, "cookie_to_dict", counted)
        await _respond(a, Request("http://www.site1.test/x"), "lang=en; Path=/; Domain=site1.test")
        assert len(converted) == 3, len(converted)  # id=1 before, id=1 and lang after
        request = Request("http://site1.test/", meta={"ha_cookies_v": 2})
        sent = await _request(workers.new(), request)
        assert sorted(sent.headers["Cookie"].split(b"; ")) == [b"id=1", b"lang=en"]
    finally:
        await workers.close()
