"""Cookie sessions shared across workers: one worker logs in, another uses the session."""

from __future__ import annotations

import json
import logging
import time
from http.cookiejar import Cookie
from typing import TYPE_CHECKING

import pytest
import redis
import redis.asyncio
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.addon import Addon
from scrapy_ha.config.middlewares import DEFAULT_COOKIES_TTL
from scrapy_ha.keys import Keys
from scrapy_ha.middlewares.cookies import SharedJars, cookie_id, cookie_to_dict, jar_field
from tests.realworld.test_realworld import Shop, _collect, _start

if TYPE_CHECKING:
    from pathlib import Path

#: Pages the first worker downloads before it stops: robots.txt, the login form, the login
#: POST and its redirect, and the first page of orders (whose children are then queued).
PAGES_BEFORE_STOP = 5
ORDERS = 40
#: Two workers of ONE crawl: the start waits until both joined (on a loaded machine the second
#: could otherwise start after the first finished and cleared the crawl, and rightly run it again).
TWO_AT_ONCE = {"HA_PREFETCH": "1", "SHOP_WAIT_WORKERS": "2"}


def _run(shop: Shop, out: Path, redis_url: str, *extra: str) -> tuple[list[dict], str]:
    proc = _start(
        "login",
        shop.url,
        out,
        redis_url,
        settings={
            "SCHEDULER_PERSIST": "True",
            "HA_PREFETCH": "1",
            **dict(e.split("=", 1) for e in extra),
        },
    )
    assert proc.wait(90) == 0, out.with_suffix(".log").read_text()[-3000:]
    items = out.with_suffix(".jl")
    lines = items.read_text().splitlines() if items.exists() else []
    return [json.loads(line) for line in lines], out.with_suffix(".log").read_text()


def test_a_session_opened_by_one_worker_serves_the_next(redis_url, tmp_path):
    """Worker A logs in and stops early; worker B, which never logged in, finishes the crawl
    with A's session cookie (without sharing, each of its order pages answers 403)."""
    shop = Shop()
    try:
        first, log_a = _run(
            shop, tmp_path / "a", redis_url, f"CLOSESPIDER_PAGECOUNT={PAGES_BEFORE_STOP}"
        )
        assert len(first) < ORDERS, "worker A did everything: the test proves nothing"
        client = redis.Redis.from_url(redis_url)
        left = _stored_values(client)
        secret = _session_value(client)  # B's finish drops it (the crawl's session ended)
        second, log_b = _run(shop, tmp_path / "b", redis_url)
    finally:
        shop.stop()
    keys = sorted(item["key"] for item in first + second)
    assert keys == sorted(f"Order {n}" for n in range(1, ORDERS + 1)), (
        f"{len(first)} items from A, {len(second)} from B: {log_b[-3000:]}"
    )
    assert "'ha/cookies/loaded'" in log_b, "worker B never loaded the shared jar"
    assert all(secret not in value for value in left), "a cookie value was stored with requests"
    assert secret not in log_a + log_b, "a cookie value reached a log"


def test_two_workers_at_once_both_use_the_login(redis_url, tmp_path):
    """Both workers crawl the orders while one of them logged in: no request goes out without
    the session (each would be answered 403, taken for a ban and retried elsewhere)."""
    shop = Shop()
    try:
        procs = [
            _start("login", shop.url, tmp_path / f"w{i}", redis_url, settings=TWO_AT_ONCE)
            for i in range(2)
        ]
        run = _collect(procs, tmp_path, time.monotonic() + 90)
    finally:
        shop.stop()
    logs = "\n".join(run.logs)
    assert run.codes == [0, 0], logs[-3000:]
    per_worker = [(tmp_path / f"w{i}.jl").read_text().count("\n") for i in range(2)]
    assert run.keys() == sorted(f"Order {n}" for n in range(1, ORDERS + 1)), per_worker
    assert "'ha/retry/banned'" not in logs, f"403s: a worker lacked the session ({per_worker})"


def test_a_finished_crawl_leaves_no_cookie_jar_behind(redis_url, tmp_path):
    """SCHEDULER_PERSIST=False: the jars are working keys of the crawl, cleared by its finish
    with the queue (they stayed, with the session, and the next crawl of the spider sent it)."""
    shop = Shop()
    try:
        items, log = _run(shop, tmp_path / "a", redis_url, "SCHEDULER_PERSIST=False")
    finally:
        shop.stop()
    assert len(items) == ORDERS, log[-3000:]
    assert "cleared its working keys" in log
    client = redis.Redis.from_url(redis_url)
    assert not client.exists("ha:{login}:cookies"), client.hgetall("ha:{login}:cookies").keys()
    client.close()


def test_a_persisted_finished_crawl_keeps_lasting_cookies_not_its_session(redis_url, tmp_path):
    """SCHEDULER_PERSIST=True: the next run of a finished crawl is another run; it keeps the
    cookies that last (an Expires or Max-Age), never the session cookies of the run that
    ended. The jars have a TTL."""
    client = redis.Redis.from_url(redis_url)
    lasting = Cookie(
        0, "lang", "en", None, False, "127.0.0.1", False, False, "/", True, False,
        int(time.time()) + 86400, False, None, None, {}, False,
    )  # fmt: skip
    stored = json.dumps({cookie_id(lasting): cookie_to_dict(lasting)})
    client.hset("ha:{login}:cookies", mapping={f"jar:{jar_field(1)}": stored, "v:1": 1})
    shop = Shop()
    try:
        items, log = _run(shop, tmp_path / "a", redis_url)  # SCHEDULER_PERSIST=True
    finally:
        shop.stop()
    assert len(items) == ORDERS, log[-3000:]
    assert "dropped 1 session cookie(s)" in log
    jar = json.loads(client.hget("ha:{login}:cookies", f"jar:{jar_field(1)}"))
    assert sorted(c["name"] for c in jar.values()) == ["lang"]
    assert 0 < client.ttl("ha:{login}:cookies") <= DEFAULT_COOKIES_TTL
    client.close()


@deferred_f_from_coro_f
async def test_jars_get_a_ttl_that_a_worker_using_them_refreshes(redis_url, redis_client):
    keys = Keys("ha", "ttl")
    cookie = {"name": "sid", "value": "v", "domain": "d", "path": "/", "rest": {}}
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        jars = SharedJars(client, keys, ttl_ms=60_000)
        await jars.store(None, {"d\t/\tsid": cookie}, [])
        assert 50_000 < redis_client.pttl(keys.cookies) <= 60_000
        redis_client.pexpire(keys.cookies, 1_000)
        jars.refresh()  # stored just now: not due yet
        assert jars._refreshing is None
        jars.refreshed -= 15.0  # a quarter of the TTL later, the worker uses the jar again
        jars.refresh()
        assert jars._refreshing is not None
        await jars._refreshing
        assert 50_000 < redis_client.pttl(keys.cookies) <= 60_000
    finally:
        await client.aclose()


def _session_value(client: redis.Redis) -> str:
    fields = client.hgetall("ha:{login}:cookies")
    jars = [json.loads(v) for k, v in fields.items() if k.startswith(b"jar:")]
    values = [c["value"] for jar in jars for c in jar.values() if c["name"] == "session"]
    assert len(values) == 1, f"the session cookie is not in the shared jar: {fields.keys()}"
    return str(values[0])


def _stored_values(client: redis.Redis) -> list[str]:
    """Everything the crawl stored in Redis except the cookie jar itself."""
    out = []
    for key in client.scan_iter("ha:*"):
        if key.endswith(b":cookies"):
            continue
        out.append(str(client.dump(key)))  # the raw bytes, as Redis would persist them
        kind = client.type(key)
        if kind == b"hash":
            out += [v.decode(errors="replace") for v in client.hvals(key)]
        elif kind == b"zset":
            out += [v.decode(errors="replace") for v in client.zrange(key, 0, -1)]
    assert any("account/order" in v for v in out), "nothing was left for worker B"
    return out


def test_the_addon_swaps_the_cookie_middleware():
    settings = Settings()
    Addon().update_settings(settings)
    mws = settings["DOWNLOADER_MIDDLEWARES"]
    assert mws["scrapy.downloadermiddlewares.cookies.CookiesMiddleware"] is None
    assert mws["scrapy_ha.cookies.SharedCookiesMiddleware"] == 700
    assert settings["SPIDER_MIDDLEWARES"]["scrapy_ha.cookies.CookieVersionMiddleware"] == 11


def test_the_addon_leaves_a_projects_cookie_choice_alone():
    settings = Settings(
        {"DOWNLOADER_MIDDLEWARES": {"scrapy.downloadermiddlewares.cookies.CookiesMiddleware": None}}
    )
    Addon().update_settings(settings)
    mws = settings["DOWNLOADER_MIDDLEWARES"]
    assert "scrapy_ha.cookies.SharedCookiesMiddleware" not in mws
    assert mws["scrapy.downloadermiddlewares.cookies.CookiesMiddleware"] is None


def test_a_request_leaves_the_downloader_without_the_cookie_values():
    """A retry or a dead-letter entry stores the request: the Cookie header must be gone."""
    from scrapy import Request
    from scrapy.http import HtmlResponse

    from scrapy_ha.keys import Keys
    from scrapy_ha.middlewares.cookies import SharedCookiesMiddleware, SharedJars

    mw = SharedCookiesMiddleware(shared=True)
    mw._jars = SharedJars(client=None, keys=Keys("ha", "shop"))
    mw._jars.versions[jar_field(None)] = 1  # this worker has the jar: the login was its own
    login = Request("http://shop.test/login")
    mw.jars[None].extract_cookies(
        HtmlResponse(login.url, headers={"Set-Cookie": "session=s3cr3t; Path=/"}), login
    )
    for finish in ("exception", "response"):
        request = Request("http://shop.test/account")
        assert mw.process_request(request) is None  # no stamp: no Redis round trip
        assert request.headers.get("Cookie") == b"session=s3cr3t"
        if finish == "exception":
            mw.process_exception(request, TimeoutError())
        else:
            mw.process_response(request, HtmlResponse(request.url, request=request))
        assert "Cookie" not in request.headers, finish


BAD_JARS = [b"{not json", b"[1, 2]", b'{"a\\t/\\tsid": 5}', b'{"x": {"name": "sid", "rest": 7}}']


@pytest.mark.parametrize("bad", BAD_JARS)
@deferred_f_from_coro_f
async def test_a_malformed_jar_is_set_aside_once_and_the_jar_starts_empty(
    redis_url, redis_client, bad, caplog
):
    keys = Keys("ha", "badjar")
    field = f"jar:{jar_field(None)}"
    redis_client.hset(keys.cookies, mapping={field: bad, f"v:{jar_field(None)}": 3})

    async def load_twice() -> list[tuple[list, int]]:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            jars = SharedJars(client, keys)
            return [await jars.load(None), await jars.load(None)]
        finally:
            await client.aclose()

    with caplog.at_level(logging.ERROR, logger="scrapy_ha.middlewares.cookies"):
        first, second = await load_twice()
    assert first == ([], 3) and second == ([], 3)
    assert redis_client.hget(keys.cookies, field) is None
    assert redis_client.hget(keys.cookies, "bad-" + field) == bad  # kept for a look
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "bad-" + field in errors[0].getMessage()


@deferred_f_from_coro_f
async def test_a_merge_into_a_malformed_jar_sets_it_aside_and_keeps_the_new_cookie(
    redis_url, redis_client
):
    keys = Keys("ha", "badmerge")
    field = f"jar:{jar_field(None)}"
    redis_client.hset(keys.cookies, field, b"{not json")
    cookie = {"name": "sid", "value": "v", "domain": "d", "path": "/", "rest": {}}

    async def store_and_load() -> tuple[list, int]:
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            jars = SharedJars(client, keys)
            await jars.store(None, {"d\t/\tsid": cookie}, [])
            return await jars.load(None)
        finally:
            await client.aclose()

    cookies, version = await store_and_load()
    assert [(c.name, c.value) for c in cookies] == [("sid", "v")] and version == 1
    assert redis_client.hget(keys.cookies, "bad-" + field) == b"{not json"
