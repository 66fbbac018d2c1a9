"""Cookie sessions shared by every worker of a crawl.

Scrapy keeps its cookie jars (the default jar and one per ``cookiejar`` meta key) in the
memory of one process. With several workers, the session cookie that one worker's login
received is unknown to the others: every request they take that needs it fails, silently.

``SharedCookiesMiddleware`` (the add-on puts it in place of Scrapy's ``CookiesMiddleware``, at
the same order 700) keeps each jar in Redis too, and is exact without a round trip per request:

- a response that changes a jar (``Set-Cookie``) merges the change into Redis and bumps the
  jar's version there, in one script; the version is stamped on that response's request
  (``meta["ha_cookies_v"]``), so its redirects and callbacks see it;
- ``CookieVersionMiddleware`` (spider middleware) stamps every request a callback yields with
  the version of its jar this worker knows, so a request yielded after a login carries a
  version that includes the login's cookies;
- before a request goes out, a worker whose copy of the jar is older than the request's stamp
  loads the jar from Redis first: the only round trip, and only when it is behind.

Cookie values are secrets: they live in their own Redis key (``keys.Keys.cookies``) and
nowhere else. The ``Cookie`` header the jar adds is taken off the request again once it
has been sent, so a retry or a dead-letter entry never stores it; versions, not values, travel
with requests; logs and stats count, never show.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import weakref
from dataclasses import dataclass, field
from http.cookiejar import Cookie
from typing import TYPE_CHECKING, Any

from scrapy.downloadermiddlewares.cookies import CookiesMiddleware
from scrapy.exceptions import NotConfigured
from scrapy.http.cookies import CookieJar
from scrapy.spidermiddlewares.base import BaseSpiderMiddleware

from scrapy_ha import metakeys
from scrapy_ha.config.middlewares import DEFAULT_COOKIES_TTL, CookiesConfig
from scrapy_ha.middlewares.registry import scheduler_for
from scrapy_ha.store import scripts
from scrapy_ha.store.connection import REDIS_DOWN_ERRORS

if TYPE_CHECKING:
    from collections.abc import Coroutine, Hashable
    from typing import Self

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response

    from scrapy_ha.keys import Keys

__all__ = ["CookieVersionMiddleware", "SharedCookiesMiddleware"]

logger = logging.getLogger(__name__)


#: The attributes of ``http.cookiejar.Cookie``, in the order its constructor takes them.
COOKIE_FIELDS = (
    "version",
    "name",
    "value",
    "port",
    "port_specified",
    "domain",
    "domain_specified",
    "domain_initial_dot",
    "path",
    "path_specified",
    "secure",
    "expires",
    "discard",
    "comment",
    "comment_url",
    "rest",
    "rfc2109",
)

#: Prefix of the field a malformed jar is moved to (kept for a look, never read again).
BAD_JAR_PREFIX = "bad-"


class BadJar(ValueError):
    """A jar in Redis that is not a JSON object of cookies."""


def cookie_id(cookie: Cookie) -> str:
    """What identifies a cookie in a jar: domain, path and name (as in ``http.cookiejar``)."""
    return f"{cookie.domain}\t{cookie.path}\t{cookie.name}"


def cookie_to_dict(cookie: Cookie) -> dict[str, Any]:
    data = {name: getattr(cookie, name) for name in COOKIE_FIELDS if name != "rest"}
    data["rest"] = dict(cookie._rest)  # type: ignore[attr-defined]
    return data


def cookie_from_dict(data: dict[str, Any]) -> Cookie:
    values: dict[str, Any] = {name: data.get(name) for name in COOKIE_FIELDS}
    values["rest"] = dict(values["rest"] or {})
    return Cookie(**values)


def snapshot(jar: CookieJar) -> dict[str, dict[str, Any]]:
    """Every cookie of *jar* by id, as JSON-ready dicts."""
    return {cookie_id(c): cookie_to_dict(c) for c in jar.jar}


def jar_field(key: Hashable) -> str:
    """The field of a jar in the cookies hash: its ``cookiejar`` meta key, JSON-encoded
    (the default jar is ``null``; ``1`` and ``"1"`` stay two jars, as in Scrapy)."""
    try:
        return json.dumps(key, sort_keys=True)
    except TypeError:
        return json.dumps(repr(key))


@dataclass
class SharedJars:
    """The jars of one worker and their versions, kept in step with Redis."""

    client: Any
    keys: Keys
    stats: Any = None
    #: how long the jars live in Redis unused (ms; 0: for ever): see HA_COOKIES_TTL
    ttl_ms: int = 0
    versions: dict[str, int] = field(default_factory=dict)
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    merge: Any = None
    set_aside: Any = None
    #: when this worker last set the jars' TTL (monotonic seconds)
    refreshed: float = -math.inf
    _refreshing: asyncio.Task[None] | None = None

    def lock(self, key: Hashable) -> asyncio.Lock:
        return self.locks.setdefault(jar_field(key), asyncio.Lock())

    def version(self, key: Hashable) -> int:
        return self.versions.get(jar_field(key), 0)

    async def store(self, key: Hashable, changed: dict[str, Any], dropped: list[str]) -> int:
        """Merge a change of this worker into Redis; return the jar's new version."""
        if self.merge is None:
            self.merge = self.client.register_script(scripts.JAR_MERGE_LUA)
        name = jar_field(key)
        args = [f"jar:{name}", f"v:{name}", json.dumps(changed), json.dumps(dropped), self.ttl_ms]
        version = int(await self.merge(keys=[self.keys.cookies], args=args))
        self.refreshed = time.monotonic()
        self._count("ha/cookies/stored")
        return version

    def refresh(self) -> None:
        """This worker uses the jars: set their TTL again once a quarter of it has passed
        (in the background: the request never waits for it), so that jars in use never
        expire while every worker has them in memory and none changes them."""
        now = time.monotonic()
        if not self.ttl_ms or now - self.refreshed < self.ttl_ms / 4000:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a test without a crawl): nothing to refresh
            return
        self.refreshed = now
        self._refreshing = loop.create_task(self._refresh())

    async def _refresh(self) -> None:
        try:
            await self.client.pexpire(self.keys.cookies, self.ttl_ms)
        except REDIS_DOWN_ERRORS as exc:
            self.refreshed = -math.inf  # the next request tries again
            logger.debug("Could not refresh the TTL of %s (%s)", self.keys.cookies, exc)

    async def load(self, key: Hashable) -> tuple[list[Cookie], int]:
        """The jar as Redis has it, and its version."""
        name = jar_field(key)
        raw, version = await self.client.hmget(self.keys.cookies, [f"jar:{name}", f"v:{name}"])
        try:
            cookies = _parse_jar(raw) if raw else []
        except BadJar as exc:
            await self._set_aside(name, raw, exc)
            cookies = []
        self._count("ha/cookies/loaded")
        return cookies, int(version or 0)

    async def _set_aside(self, name: str, raw: bytes, exc: BadJar) -> None:
        """One bad jar costs that jar alone: move it aside, go on with an empty one."""
        if self.set_aside is None:
            self.set_aside = self.client.register_script(scripts.JAR_SET_ASIDE_LUA)
        field_name = f"jar:{name}"
        moved = await self.set_aside(keys=[self.keys.cookies], args=[field_name, raw])
        if moved:
            self._count("ha/cookies/bad_jar")
            logger.error(
                "The shared cookie jar %s in %s is malformed (%s): moved it to the field %s "
                "and started this jar from empty; the next login fills it again",
                name,
                self.keys.cookies,
                exc,
                BAD_JAR_PREFIX + field_name,
            )

    def _count(self, stat: str) -> None:
        if self.stats is not None:
            self.stats.inc_value(stat)


def _parse_jar(raw: bytes | str) -> list[Cookie]:
    """The cookies of a stored jar; :class:`BadJar` says what is wrong with it."""
    try:
        stored = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadJar(f"not JSON: {exc}") from None
    if not isinstance(stored, dict) or not all(isinstance(c, dict) for c in stored.values()):
        raise BadJar("not a JSON object of cookie objects")
    try:
        return [cookie_from_dict(c) for c in stored.values()]
    except (TypeError, ValueError, AttributeError) as exc:
        raise BadJar(f"a cookie cannot be rebuilt: {exc}") from None


_SHARED: weakref.WeakKeyDictionary[Crawler, SharedCookiesMiddleware] = weakref.WeakKeyDictionary()


class SharedCookiesMiddleware(CookiesMiddleware):
    """Scrapy's ``CookiesMiddleware`` whose jars every worker of the crawl shares.

    With ``HA_SHARED_COOKIES = False``, or a scheduler other than scrapy-ha's, it is exactly
    Scrapy's middleware.
    """

    def __init__(
        self, debug: bool = False, *, shared: bool = True, ttl: float = DEFAULT_COOKIES_TTL
    ) -> None:
        super().__init__(debug)
        self.shared = shared
        self.ttl = ttl
        self._jars: SharedJars | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = CookiesConfig.from_settings(crawler.settings)
        if not config.enabled:
            raise NotConfigured
        o = cls(config.debug, shared=config.shared, ttl=config.ttl)
        o.crawler = crawler
        _SHARED[crawler] = o
        return o

    # -- Scrapy's hooks --------------------------------------------------------------

    def process_request(  # type: ignore[override]  # Scrapy's stub has no awaitable return
        self, request: Request, spider: Spider | None = None
    ) -> Coroutine[Any, Any, None] | None:
        """Add the jar's cookies; first load the jar if the request needs a newer one."""
        jars = self._shared(request)
        if jars is None:
            return super().process_request(request)  # type: ignore[return-value]
        key = request.meta.get("cookiejar")
        if request.meta.get(metakeys.COOKIES_VERSION, 0) > jars.version(key) or request.cookies:
            return self._process_request(jars, request)
        return super().process_request(request)  # type: ignore[return-value]

    def process_response(  # type: ignore[override]  # Scrapy's stub has no awaitable return
        self, request: Request, response: Response, spider: Spider | None = None
    ) -> Response | Coroutine[Any, Any, Response]:
        """Keep the cookies the response sets; store them in Redis when they change the jar."""
        jars = self._shared(request)
        if jars is None:
            return super().process_response(request, response)  # type: ignore[return-value]
        _forget_cookie_header(request)
        if not response.headers.getlist("Set-Cookie"):
            return super().process_response(request, response)  # type: ignore[return-value]
        return self._process_response(jars, request, response)

    def process_exception(self, request: Request, exception: BaseException) -> None:
        """The request may be retried or dead-lettered: it must not carry the cookie values."""
        if self._shared(request) is not None:
            _forget_cookie_header(request)

    # -- shared jars -----------------------------------------------------------------

    def _shared(self, request: Request) -> SharedJars | None:
        if not self.shared or request.meta.get("dont_merge_cookies", False):
            return None
        if self._jars is None:
            self._jars = self._connect()
        if self._jars is not None:
            self._jars.refresh()
        return self._jars

    def _connect(self) -> SharedJars | None:
        scheduler = scheduler_for(self.crawler)
        if scheduler is None or scheduler.queue is None:
            logger.info(
                "HA_SHARED_COOKIES: the scheduler is not scrapy-ha's, so cookie jars "
                "stay in this process (as with Scrapy's CookiesMiddleware)"
            )
            self.shared = False
            return None
        queue = scheduler.queue
        return SharedJars(queue.client, queue.keys, self.crawler.stats, int(self.ttl * 1000))

    async def _process_request(self, jars: SharedJars, request: Request) -> None:
        key = request.meta.get("cookiejar")
        async with jars.lock(key):
            if request.meta.get(metakeys.COOKIES_VERSION, 0) > jars.version(key):
                await self._catch_up(jars, key)
            before = snapshot(self.jars[key]) if request.cookies else None
            super().process_request(request)
            if before is not None:
                await self._publish(jars, key, before, request)

    async def _process_response(
        self, jars: SharedJars, request: Request, response: Response
    ) -> Response:
        key = request.meta.get("cookiejar")
        async with jars.lock(key):
            before = snapshot(self.jars[key])
            super().process_response(request, response)
            await self._publish(jars, key, before, request)
        return response

    async def _publish(
        self, jars: SharedJars, key: Hashable, before: dict[str, Any], request: Request
    ) -> None:
        """Store what changed in the jar (under its lock) and stamp the new version."""
        after = snapshot(self.jars[key])
        changed = {i: c for i, c in after.items() if before.get(i) != c}
        dropped = [i for i in before if i not in after]
        if not changed and not dropped:
            return
        known = jars.version(key)
        try:
            version = await jars.store(key, changed, dropped)
        except REDIS_DOWN_ERRORS as exc:
            logger.warning(
                "Could not share the cookies of jar %s with the other workers (%s); this "
                "worker keeps them",
                jar_field(key),
                type(exc).__name__,
            )
            return
        if version != known + 1:  # another worker changed the jar meanwhile: take it all
            await self._catch_up(jars, key)
        jars.versions[jar_field(key)] = max(version, jars.version(key))
        request.meta[metakeys.COOKIES_VERSION] = jars.version(key)

    async def _catch_up(self, jars: SharedJars, key: Hashable) -> None:
        """Replace this worker's copy of the jar with Redis's (called under the jar's lock)."""
        try:
            cookies, version = await jars.load(key)
        except REDIS_DOWN_ERRORS as exc:
            logger.warning(
                "Could not load the shared cookies of jar %s (%s); sending this worker's own",
                jar_field(key),
                type(exc).__name__,
            )
            return
        jar = CookieJar()
        for cookie in cookies:
            jar.jar.set_cookie(cookie)
        self.jars[key] = jar
        jars.versions[jar_field(key)] = max(version, jars.version(key))


def _forget_cookie_header(request: Request) -> None:
    """Take back the header the jar added: Scrapy adds it again before each download."""
    request.headers.pop("Cookie", None)


class CookieVersionMiddleware(BaseSpiderMiddleware):
    """Spider middleware: stamp each yielded request with the version of its jar this worker
    knows, so that whichever worker sends it first catches up to it."""

    def get_processed_request(self, request: Request, response: Response | None) -> Request:
        owner = _SHARED.get(self.crawler)
        jars = owner._jars if owner is not None else None
        if jars is None or request.meta.get("dont_merge_cookies", False):
            return request
        version = jars.version(request.meta.get("cookiejar"))
        if version > request.meta.get(metakeys.COOKIES_VERSION, 0):
            request.meta[metakeys.COOKIES_VERSION] = version
        return request
