"""A worker's first request of a shared cookie jar carries what the jar holds in Redis:
the cookies a finished crawl kept for its next run (SCHEDULER_PERSIST=True keeps those that
last), and a session another worker opened, also for a request that no callback stamped
with the jar's version (a start request, one pushed with ``scrapy-ha push``). Real Redis."""

from __future__ import annotations

import json
import time
from http.cookiejar import Cookie

import redis.asyncio
from scrapy import Request
from scrapy.http import HtmlResponse
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.keys import Keys
from scrapy_ha.middlewares.cookies import (
    SharedCookiesMiddleware,
    SharedJars,
    cookie_id,
    cookie_to_dict,
    jar_field,
)

KEYS = Keys("ha", "shop")


def lasting(name: str, value: str) -> Cookie:
    return Cookie(
        0, name, value, None, False, "shop.test", False, False, "/", True, False,
        int(time.time()) + 86400, False, None, None, {}, False,
    )  # fmt: skip


async def sent(mw: SharedCookiesMiddleware, request: Request) -> bytes | None:
    """The Cookie header *request* goes out with (the middleware as the downloader runs it)."""
    pending = mw.process_request(request)
    if pending is not None:
        await pending
    return request.headers.get("Cookie")


@deferred_f_from_coro_f
async def test_the_first_request_of_a_worker_carries_the_jar_redis_keeps(redis_url: str) -> None:
    """A QA run: the second run of a persisted login crawl sent its start request without
    the lasting cookie (``remember``) the first run kept in the shared jar, and so did
    every request until a response set a cookie and made the worker load the jar."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        kept = lasting("remember", "alice")
        field = jar_field(None)
        await client.hset(
            KEYS.cookies,
            mapping={f"jar:{field}": json.dumps({cookie_id(kept): cookie_to_dict(kept)})},
        )
        await client.hset(KEYS.cookies, f"v:{field}", 9)
        mw = SharedCookiesMiddleware(shared=True)
        mw._jars = SharedJars(client, KEYS)
        start = Request("http://shop.test/login")  # no version stamp: a start request
        assert await sent(mw, start) == b"remember=alice"
        # loaded once: the next request costs no Redis call, and carries it too
        assert mw.process_request(Request("http://shop.test/p/1")) is None
        # a session another worker opens meanwhile: its requests carry the version
        response = HtmlResponse(start.url, request=start, headers={"Set-Cookie": "sid=1; Path=/"})
        stored = mw.process_response(start, response)
        if not isinstance(stored, HtmlResponse):
            await stored
        other = Request("http://shop.test/p/2")
        assert await sent(mw, other) in (b"remember=alice; sid=1", b"sid=1; remember=alice")
    finally:
        await client.aclose()


@deferred_f_from_coro_f
async def test_a_jar_redis_does_not_have_is_asked_for_once(redis_url: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        mw = SharedCookiesMiddleware(shared=True)
        mw._jars = SharedJars(client, KEYS)
        assert await sent(mw, Request("http://shop.test/a", meta={"cookiejar": 2})) is None
        assert mw.process_request(Request("http://shop.test/b", meta={"cookiejar": 2})) is None
    finally:
        await client.aclose()
