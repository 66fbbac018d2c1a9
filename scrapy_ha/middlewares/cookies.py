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
with requests; logs and stats count, never show. How a jar is stored in Redis is
:mod:`scrapy_ha.store.jars`.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any

from scrapy.downloadermiddlewares.cookies import CookiesMiddleware
from scrapy.exceptions import NotConfigured
from scrapy.http.cookies import CookieJar
from scrapy.spidermiddlewares.base import BaseSpiderMiddleware

from scrapy_ha import metakeys
from scrapy_ha.config.middlewares import DEFAULT_COOKIES_TTL, CookiesConfig
from scrapy_ha.config.startup import configured
from scrapy_ha.middlewares.cookie_changes import deletions, request_domains
from scrapy_ha.middlewares.registry import scheduler_for
from scrapy_ha.store.connection import REDIS_DOWN_ERRORS
from scrapy_ha.store.jars import (
    SharedJars,
    cookie_from_dict,
    cookie_id,
    cookie_to_dict,
    jar_field,
    snapshot,
    snapshot_domains,
)

if TYPE_CHECKING:
    from collections.abc import Coroutine, Hashable, Iterable
    from typing import Self

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = [
    "CookieVersionMiddleware",
    "SharedCookiesMiddleware",
    "shared_cookies",
    # the Redis side, re-exported for the code that imported it from here
    "SharedJars",
    "cookie_from_dict",
    "cookie_id",
    "cookie_to_dict",
    "jar_field",
    "snapshot",
]

logger = logging.getLogger(__name__)


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
        config = configured(crawler, CookiesConfig.from_settings)
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
        if _behind(jars, key, request) or request.cookies:
            return self._process_request(jars, request)
        _stamp_epoch(jars, key, request)
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
            if _behind(jars, key, request):
                await self._catch_up(jars, key)
            _stamp_epoch(jars, key, request)
            domains = request_domains(request)
            before = snapshot_domains(self.jars[key], domains) if request.cookies else None
            super().process_request(request)
            if before is not None:
                await self._publish(jars, key, (domains, before), request)

    async def _process_response(
        self, jars: SharedJars, request: Request, response: Response
    ) -> Response:
        key = request.meta.get("cookiejar")
        deleted = deletions(request, response)
        domains = request_domains(request)
        async with jars.lock(key):
            if _stale(jars, key, request):  # an answer to an expired session: none of its
                return response  # cookies replace the newer login's (login_once)
            before = snapshot_domains(self.jars[key], domains)
            super().process_response(request, response)
            await self._publish(jars, key, (domains, before), request, deleted)
        return response

    async def login_done(
        self, key: Hashable, epoch: int, domains: Iterable[str] = (), failed_ms: int = 0
    ) -> None:
        """Login *epoch* of jar *key* (``login_once``) answered, its cookies merged: store
        this worker's cookies of *domains* (the login's sites) with its epoch, then mark
        the login done, so that the pages waiting for it go again with its session. (A site
        that authenticates the session cookie it was sent sets none: the session the login
        opened is this worker's copy, and Redis may hold an earlier one.) With *failed_ms*,
        its answer failed the spider's check: nothing is stored, the login is marked failed
        and no worker logs in for *failed_ms*."""
        jars = self._jars
        if jars is None:
            return
        async with jars.lock(key):
            opened = snapshot_domains(self.jars[key], set(domains)) if domains else {}
            try:
                if failed_ms:
                    await jars.login_step(key, "failed", epoch, failed_ms)
                else:
                    if opened:
                        await jars.store(key, opened, [], epoch)
                    await jars.login_step(key, "done", epoch)
            except REDIS_DOWN_ERRORS as exc:
                logger.warning(
                    "Could not tell the other workers that the login of cookie jar %s "
                    "%s (%s): they log in again after its timeout",
                    jar_field(key),
                    "failed" if failed_ms else "answered",
                    type(exc).__name__,
                )
                return
            finally:  # this worker's copy follows Redis again (unless a newer login of
                if jars.logging_in.get(jar_field(key)) == epoch:  # its own holds it)
                    jars.logging_in.pop(jar_field(key), None)
            # the jar as Redis has it now, with its epoch (while the login was in flight this
            # worker took none of Redis's changes)
            await self._catch_up(jars, key)

    async def take_jar(self, key: Hashable) -> None:
        """Take jar *key* from Redis again (``login_once``: a login of this worker's was
        taken over by another worker's, whose session Redis holds)."""
        if self._jars is not None:
            async with self._jars.lock(key):
                await self._catch_up(self._jars, key)

    async def _publish(
        self,
        jars: SharedJars,
        key: Hashable,
        seen: tuple[set[str], dict[str, Any]],
        request: Request,
        deleted: Iterable[str] = (),
    ) -> None:
        """Store what changed in the jar (under its lock) and stamp the new version. *seen*
        is the domains the request can change and their cookies before it did; the cookies
        in *deleted* (the response deleted them) are dropped from the shared jar whether or
        not this worker had them."""
        domains, before = seen
        after = snapshot_domains(self.jars[key], domains)
        changed = {i: c for i, c in after.items() if before.get(i) != c}
        dropped = [i for i in before if i not in after]
        dropped += [i for i in deleted if i not in after and i not in before]
        if not changed and not dropped:
            return
        known = jars.version(key)
        try:
            version = await jars.store(key, changed, dropped, _epoch(request))
        except REDIS_DOWN_ERRORS as exc:
            logger.warning(
                "Could not share the cookies of jar %s with the other workers (%s); this "
                "worker keeps them",
                jar_field(key),
                type(exc).__name__,
            )
            return
        if not version:  # it changed nothing in Redis (a deletion of a cookie none had)
            return
        if version < 0:  # sent with an expired session: take back the newer login's cookies
            await self._catch_up(jars, key)
            return
        if version != known + 1:  # another worker changed the jar meanwhile: take it all
            await self._catch_up(jars, key)
        jars.versions[jar_field(key)] = max(version, jars.version(key))
        request.meta[metakeys.COOKIES_VERSION] = jars.version(key)

    async def _catch_up(self, jars: SharedJars, key: Hashable) -> None:
        """Replace this worker's copy of the jar with Redis's (called under the jar's lock),
        unless this worker has a login of the jar in flight (``login_once``): the session
        it opens is this copy's (a site may authenticate the cookie it was sent), stored in
        Redis when the login answered, and taken then."""
        if jars.logging_in.get(jar_field(key)):
            return
        try:
            cookies, version = await jars.load(key)
        except REDIS_DOWN_ERRORS as exc:
            logger.warning(
                "Could not load the shared cookies of jar %s (%s); sending this worker's own",
                jar_field(key),
                type(exc).__name__,
            )
            jars.versions.setdefault(jar_field(key), 0)  # a newer stamp tries again
            return
        jar = CookieJar()
        for cookie in cookies:
            jar.jar.set_cookie(cookie)
        self.jars[key] = jar
        jars.versions[jar_field(key)] = max(version, jars.version(key))


def _behind(jars: SharedJars, key: Hashable, request: Request) -> bool:
    """Must this worker load the jar before sending *request*: it never had the jar (its
    first request of it: the cookies a finished run kept, a session another worker opened,
    for a request no callback stamped, a start request or a pushed one), or the request
    was stamped with a newer version than its copy."""
    if jar_field(key) not in jars.versions:
        return True
    return bool(request.meta.get(metakeys.COOKIES_VERSION, 0) > jars.version(key))


def _stamp_epoch(jars: SharedJars, key: Hashable, request: Request) -> None:
    """Note on *request* the login epoch of the session it is sent with (for
    ``login_once``); a redirect keeps the first one of its chain: the page sent to the
    login form is the one that met the expiry, with the session it was sent with."""
    meta = request.meta
    if "redirect_urls" in meta or metakeys.LOGGING_IN in meta:  # its chain's first has it
        return  # (or none: sent before any epoch); a login carries its own
    if jars.epochs or metakeys.LOGIN_EPOCH in meta:  # else no login_once in this crawl yet
        meta[metakeys.LOGIN_EPOCH] = jars.epochs.get(jar_field(key), 0)


def _epoch(request: Request) -> int:
    """The login epoch of the session *request* was sent with (0: none noted)."""
    return int(request.meta.get(metakeys.LOGIN_EPOCH, 0))


def _stale(jars: SharedJars, key: Hashable, request: Request) -> bool:
    """Was *request* sent with the session of an older login than the one this worker's copy
    of the jar holds, or than the login request this worker has in flight (``login_once``):
    its answer's cookies belong to an expired session."""
    name = jar_field(key)
    return _epoch(request) < max(jars.epochs.get(name, 0), jars.logging_in.get(name, 0))


def shared_cookies(
    spider: Spider, request: Request
) -> tuple[SharedCookiesMiddleware | None, SharedJars | None]:
    """The shared cookie middleware of *spider*'s crawl and its jars, for *request*; the jars
    are None when they are not shared (another scheduler, ``HA_SHARED_COOKIES = False``,
    ``dont_merge_cookies``)."""
    crawler = getattr(spider, "crawler", None)
    owner = _SHARED.get(crawler) if crawler is not None else None
    return owner, (owner._shared(request) if owner is not None else None)


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
