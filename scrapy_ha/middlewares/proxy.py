"""Proxy rotation driven by ban signals: a tunnel proxy or a pool fetched from an API.

``scrapy_ha.proxy.ProxyMiddleware`` (downloader middleware at 740, just before Scrapy's
``HttpProxyMiddleware`` at 750, which turns the credentials into the
``Proxy-Authorization`` header) sets ``meta["proxy"]`` on every attempt:

- **tunnel** (``HA_PROXY_MODE = "tunnel"``): one proxy URL with credentials; the provider
  changes the exit. With ``HA_PROXY_SESSION_TEMPLATE`` (e.g. ``"{user}-session-{session}"``)
  a ban puts a new session token in the user name: the exit changes, and since Scrapy keys
  its CONNECT tunnels by the proxy's credentials, HTTPS gets a fresh tunnel instead of the
  kept-alive one. ``HA_PROXY_ROTATE_HEADER`` (``"Name: value"``) is sent with the next plain
  HTTP request after a ban (that attempt only). Without a template an HTTPS ban cannot
  change the exit: one WARNING, and no rotation is counted.
- **pool** (``HA_PROXY_MODE = "pool"``): proxies fetched from ``HA_PROXY_POOL_URL`` (a JSON
  list of ``{"ip", "port"}`` or ``"ip:port"``, or ``HA_PROXY_POOL_PARSER``), cached for
  ``HA_PROXY_POOL_TTL`` (one fetch at a time, in the background), used in turn; a proxy
  that a site banned is out of rotation for that site for ``HA_PROXY_COOLDOWN``, one that
  failed for every site, on every worker (shared through Redis); when none is usable the
  request waits in Redis (or goes direct with ``HA_PROXY_ALLOW_DIRECT``) and the list is
  kept until its TTL is over.

With ``HA_PROXY_ALLOW_DIRECT`` the tunnel proxy cools down too (on this worker) when it
fails as a pool proxy would, and its requests go direct until the cool-down is over.

Ban signals are the retry classification's: ``banned`` and ``rate_limited`` responses, and
``network`` errors through the proxy; a pool proxy's own 502 or 504 answers too (see
:mod:`.proxy_gateway`). A 407 from the tunnel proxy is a configuration error: one
ERROR naming the proxy (password masked), and the crawl stops (the request is kept). A 407
from a pool proxy cools that proxy down and sends the request back for another; the crawl
stops only when every proxy of the list answered 407.
Credentials never reach Redis, logs, stats or the dead-letter queue.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from scrapy.exceptions import NotConfigured
from scrapy.utils.httpobj import urlparse_cached

from scrapy_ha import metakeys
from scrapy_ha.codec import mask_url
from scrapy_ha.config.middlewares import ProxyConfig
from scrapy_ha.config.retry import RetryConfig
from scrapy_ha.config.startup import configured
from scrapy_ha.middlewares.proxy_gateway import GatewayErrors
from scrapy_ha.middlewares.proxy_shared import SharedCooldowns
from scrapy_ha.middlewares.proxy_sources import (
    TIMEOUTS,
    ProxyHealth,
    ProxyPool,
    TunnelProxy,
    cooling_key,
    proxy_id,
    tunnel_status,
)
from scrapy_ha.store.hosts import url_host
from scrapy_ha.verdict import FailureClass, Verdict

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = ["ProxyMiddleware", "tunnel_status"]

logger = logging.getLogger(__name__)

#: Seconds a request waits in Redis when no proxy can be had.
NO_PROXY_DELAY = 30.0
#: Seconds a request waits when choosing its proxy failed (Redis or the pool API down):
#: long enough for a blip to pass, short next to a lease.
PROXY_ERROR_DELAY = 5.0
#: Proxies with stats of their own (``ha/proxy/<id>/...``); the rest are counted under
#: ``ha/proxy/other/...``, so a pool that hands out thousands of IPs keeps the stats small.
MAX_PROXY_STATS = 100
#: A proxy's answer when its credentials are refused.
PROXY_AUTH_REQUIRED = 407
#: Seconds a request waits after the proxy refused its credentials (the crawl is stopping).
PROXY_AUTH_DELAY = 60.0
#: Classes of a response that are ban signals: the proxy is rotated. A tunnel's exit
#: changes on a ``rate_limited`` answer too; a pool's proxy is not cooled down for it (a
#: cool-down takes it from every site: one host's 429 with ``Retry-After: 1`` left a crawl
#: without proxies for HA_PROXY_COOLDOWN), the domain's gate holds that site back instead.
BAN_CLASSES = (FailureClass.BANNED, FailureClass.RATE_LIMITED)
POOL_BAN_CLASSES = (FailureClass.BANNED,)


class ProxyMiddleware:
    """Sets ``meta["proxy"]`` on every attempt and rotates on ban signals."""

    def __init__(self, crawler: Crawler, config: ProxyConfig, retry_config: RetryConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.retry_config = retry_config
        self.stats = crawler.stats
        self.tunnel = TunnelProxy(config) if config.mode == "tunnel" else None
        self.pool = ProxyPool(config, crawler.stats) if config.mode == "pool" else None
        #: whose proxies cool down: the pool's; the tunnel's when its requests may go direct
        self.health: ProxyHealth | None = self.pool
        if self.tunnel is not None and config.allow_direct:
            self.health = self.tunnel
        self.shared = SharedCooldowns(crawler, config.cooldown)
        self._auth_failed = False
        self._warned_unavailable = False
        # hosts that met no usable proxy since the ERROR: only a proxy for one of them
        # (not one for another site, whose proxies no site banned) ends the run
        self._without_proxy: set[str] = set()
        self._refused: set[str] = set()  # pool proxies that answered 407
        self._gateway = GatewayErrors(
            config.max_failures,
            lambda pid: self._stat(pid, "failures"),
            witness=not config.allow_direct,  # (else no proxy might ever be there to tell)
        )
        self._warned_https = False
        self._stat_ids: set[str] = set()
        if config.allow_direct:
            logger.info(
                "HA_PROXY_ALLOW_DIRECT: while %s out of rotation (%d failures in a row, or "
                "its own 502/504 answers), requests go direct, from this machine's own "
                "address, for HA_PROXY_COOLDOWN (%g s)",
                "the tunnel proxy is" if self.tunnel else "every proxy of the pool is",
                config.max_failures,
                config.cooldown,
            )

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = configured(crawler, ProxyConfig.from_settings)
        if config is None:
            raise NotConfigured  # no proxy configured: silent (Scrapy warns if given a reason)
        return cls(crawler, config, configured(crawler, RetryConfig.from_settings))

    async def process_request(self, request: Request) -> Request | None:
        if request.meta.get("dont_proxy"):
            return None
        try:
            url = self._from_tunnel(request) if self.tunnel else await self._from_pool(request)
        except Exception as exc:  # never let a middleware's own failure end the request
            logger.warning(
                "Could not choose a proxy for %s (%s): it waits %.0f s in the queue",
                request,
                exc,
                PROXY_ERROR_DELAY,
            )
            self.stats.inc_value("ha/proxy/errors")
            reason = f"choosing a proxy: {exc}"
            return _wait(request, PROXY_ERROR_DELAY, FailureClass.PROXY_ERROR, reason)
        if url is None:
            return self._no_proxy(request)
        if self._without_proxy and url_host(request.url) in self._without_proxy:
            self._without_proxy.clear()
            self._warned_unavailable = False  # the next run of requests without one is told
        pid = proxy_id(url, user=self.pool is not None)
        request.meta["proxy"] = url
        request.meta[metakeys.PROXY] = pid
        if self.tunnel is not None:
            request.meta[metakeys.PROXY_SESSION] = self.tunnel.session
            self._rotation_header(request)
        self._stat(pid, "requests")
        return None

    def _stat(self, pid: str, what: str) -> None:
        if pid not in self._stat_ids:
            if len(self._stat_ids) >= MAX_PROXY_STATS:
                pid = "other"
            else:
                self._stat_ids.add(pid)
        self.stats.inc_value(f"ha/proxy/{pid}/{what}")

    def process_response(self, request: Request, response: Response) -> Request | Response:
        self._drop_rotation_header(request)
        if response.status == PROXY_AUTH_REQUIRED and metakeys.PROXY in request.meta:
            return self._proxy_auth_failed(request, f"HTTP 407 from {request.meta[metakeys.PROXY]}")
        if self.health is not None and metakeys.PROXY in request.meta:
            self._answer(self.health, request, response.status)
        try:
            fclass = self.retry_config.classify_response(response)
        except Exception:  # HA_BAN_CHECK raised: the retry middleware, next, judges the
            return response  # response again and dead-letters it as `error` (here it was acked)
        bans = BAN_CLASSES if self.pool is None else POOL_BAN_CLASSES
        if fclass is not None and fclass in bans:
            self._ban(request, fclass)
        return response

    def _answer(self, health: ProxyHealth, request: Request, status: int) -> None:
        pid, host = request.meta[metakeys.PROXY], url_host(request.url)
        health.failures.pop(pid, None)  # "in a row": reset
        self._refused.discard(pid)  # its 407 was passing
        if self._gateway.answer(pid, host, request.url, status):
            self._cool_down(pid, f"{status} answers of its own ({request.url})", host)

    def process_exception(self, request: Request, exception: Exception) -> Request | None:
        self._drop_rotation_header(request)
        if metakeys.PROXY not in request.meta:
            return None
        if tunnel_status(exception) == PROXY_AUTH_REQUIRED:  # CONNECT refused: credentials
            return self._proxy_auth_failed(request, f"CONNECT answered {PROXY_AUTH_REQUIRED}")
        if self.retry_config.classify_exception(exception) == FailureClass.NETWORK:
            self._failure(request, url_host(request.url) if isinstance(exception, TIMEOUTS) else "")
        return None

    async def _from_pool(self, request: Request) -> str | None:
        assert self.pool is not None
        return await self.pool.choose(self.shared.load, url_host(request.url))

    def _from_tunnel(self, request: Request) -> str | None:
        """The tunnel's URL; None while it cools down (HA_PROXY_ALLOW_DIRECT only)."""
        assert self.tunnel is not None
        if self.health is self.tunnel and self.tunnel.out(
            self.tunnel.id, url_host(request.url), time.time()
        ):
            return None
        return self.tunnel.url()

    def _rotation_header(self, request: Request) -> None:
        """After a ban, HA_PROXY_ROTATE_HEADER goes with the next plain-HTTP request (only
        there can the proxy read it: inside an HTTPS tunnel the site would) and only with
        this attempt: :meth:`_drop_rotation_header` takes it off before a retry is made."""
        assert self.tunnel is not None
        if not (self.tunnel.rotate_next and self.config.rotate_header):
            return
        if urlparse_cached(request).scheme != "http":
            return  # the next plain-HTTP request carries it
        self.tunnel.rotate_next = False
        name, value = self.config.rotate_header
        request.headers[name] = value
        request.meta[metakeys.ROTATE_HEADER] = True

    def _drop_rotation_header(self, request: Request) -> None:
        if request.meta.pop(metakeys.ROTATE_HEADER, False) and self.config.rotate_header:
            request.headers.pop(self.config.rotate_header[0], None)

    def _tunnel_can_rotate(self, request: Request) -> bool:
        """Can a new session change this request's exit? With a session template, yes;
        over HTTPS without one, no (one kept-alive CONNECT tunnel keeps its exit: one
        WARNING); over plain HTTP, with a rotation header."""
        if self.config.session_template:
            return True
        if urlparse_cached(request).scheme == "https":
            if not self._warned_https:
                self._warned_https = True
                logger.warning(
                    "A ban on %s cannot change the tunnel proxy's exit: HTTPS requests "
                    "share one kept-alive CONNECT tunnel. Set HA_PROXY_SESSION_TEMPLATE "
                    "(e.g. '{user}-session-{session}') so that a ban starts a new session; "
                    "until then HTTPS bans are retried through the same exit",
                    request,
                )
            return False
        return self.config.rotate_header is not None

    def _ban(self, request: Request, fclass: FailureClass) -> None:
        pid = request.meta.get(metakeys.PROXY)
        if pid is None:
            return
        self._stat(pid, "bans")
        # (a pool proxy is out for the banning site alone: see cooling_key)
        self._rotate(request, pid, f"{fclass} ({request.url})", url_host(request.url))

    def _failure(self, request: Request, timed_out: str) -> None:
        """A network error through the proxy; *timed_out*: the site it timed out at."""
        pid = request.meta[metakeys.PROXY]
        self._stat(pid, "failures")
        if self.tunnel is not None:
            self._rotate(request, pid, "connection failures")  # a new exit, as ever
        site = self.health.failed(pid, timed_out) if self.health is not None else None
        if site is not None:  # after HA_PROXY_MAX_FAILURES in a row
            self._cool_down(pid, "timeouts" if site else "connection failures", site)

    def _rotate(self, request: Request, pid: str, why: str, site: str = "") -> None:
        """Change the tunnel's exit; or cool pool proxy *pid* down, for *site* alone
        (a host: it banned the proxy), else for every site."""
        if self.tunnel is not None:
            if not self._tunnel_can_rotate(request):
                return  # nothing would change: no rotation to count or log
            if self.tunnel.rotate(request.meta.get(metakeys.PROXY_SESSION)):
                self.stats.inc_value("ha/proxy/rotations")
                logger.info("Rotating the tunnel proxy's exit after %s", why)
            return
        self._cool_down(pid, why, site)

    def _cool_down(self, pid: str, why: str, site: str) -> None:
        """Take *pid* (a pool's proxy, or the tunnel with HA_PROXY_ALLOW_DIRECT) out of
        rotation for *site* alone, else ("") for every site."""
        health = self.health
        assert health is not None
        if health.cooling.get(cooling_key(pid, site), 0) > time.time():
            # already out: this answer was on its way when it was taken out (counted,
            # logged and shared once, not once per request it carried at the time)
            if not site:
                health.failures.pop(pid, None)  # back with no failure counted, as below
            return
        health.cool_down(pid, site)
        self.stats.inc_value("ha/proxy/rotations")
        logger.info(
            "Proxy %s out of rotation %s for %.0f s after %s%s",
            pid,
            f"for {site}" if site else "for every site",
            self.config.cooldown,
            why,
            ": its requests go direct meanwhile (HA_PROXY_ALLOW_DIRECT)" if self.tunnel else "",
        )
        if self.pool is not None:  # (the tunnel's is this worker's own)
            asyncio.ensure_future(self.shared.share(cooling_key(pid, site)))

    def _no_proxy(self, request: Request) -> Request | None:
        if self.config.allow_direct:
            for key in ("proxy", metakeys.PROXY):  # a retry still carries its last proxy
                request.meta.pop(key, None)
            self.stats.inc_value("ha/proxy/direct")
            return None
        if self.pool is not None and not self.pool.loaded:  # the API never answered yet
            self.stats.inc_value("ha/proxy/errors")
            delay = max(PROXY_ERROR_DELAY, self.pool.retry_in())
            reason = f"no proxy list yet ({self.pool.error})"
            return _wait(request, delay, FailureClass.PROXY_ERROR, reason)
        self.stats.inc_value("ha/proxy/unavailable")
        if len(self._without_proxy) < MAX_PROXY_STATS:
            self._without_proxy.add(url_host(request.url))
        if not self._warned_unavailable:  # once until a proxy is usable again for them
            self._warned_unavailable = True
            logger.error(
                "No usable proxy for %s (pool empty, or all cooling down for its site): "
                "requests wait "
                "%.0f s in the queue until one is (HA_PROXY_ALLOW_DIRECT=False)",
                request,
                NO_PROXY_DELAY,
            )
        return _wait(request, NO_PROXY_DELAY, FailureClass.NO_PROXY, "no usable proxy")

    def _proxy_auth_failed(self, request: Request, detail: str) -> Request:
        if self.pool is not None:
            return self._pool_proxy_refused(request, detail)
        if not self._auth_failed:
            self._auth_failed = True
            shown = mask_url(self.tunnel.url()) if self.tunnel else request.meta[metakeys.PROXY]
            logger.error(
                "The proxy %s rejected its credentials (%s): check HA_PROXY_URL / "
                "HA_PROXY_USER / HA_PROXY_PASSWORD. Stopping the crawl; queued "
                "requests are kept.",
                shown,
                detail,
            )
            self._stop_crawl()
        reason = "the proxy rejected its credentials (407)"
        return _wait(request, PROXY_AUTH_DELAY, FailureClass.PROXY_AUTH, reason)

    def _pool_proxy_refused(self, request: Request, detail: str) -> Request:
        """A pool proxy answered 407 (a dead or foreign proxy in the list): it cools down
        and the request goes back at once for another; the crawl stops only when every
        proxy of the list did so."""
        assert self.pool is not None
        pid = request.meta[metakeys.PROXY]
        self._stat(pid, "auth_failures")
        self._refused.add(pid)
        listed = {proxy_id(p, user=True) for p in self.pool.proxies}
        self._refused &= listed | {pid}  # bounded by the list
        if listed and listed <= self._refused:
            if not self._auth_failed:
                self._auth_failed = True
                logger.error(
                    "Every proxy of the pool from %s rejected its credentials (%s, the "
                    "last from %s): the list's proxies want credentials it does not give "
                    "(give them as http://user:password@host:port with "
                    "HA_PROXY_POOL_PARSER, or fix HA_PROXY_POOL_URL). Stopping the crawl; "
                    "queued requests are kept.",
                    self.pool.api.shown,
                    detail,
                    pid,
                )
                self._stop_crawl()
            reason = "every pool proxy rejected its credentials (407)"
            return _wait(request, PROXY_AUTH_DELAY, FailureClass.PROXY_AUTH, reason)
        self._rotate(request, pid, f"rejecting its credentials ({detail})")
        return _wait(request, 0.0, FailureClass.PROXY_AUTH, f"the proxy {pid} answered 407")

    def _stop_crawl(self) -> None:
        self.stats.set_value("ha/proxy/auth_failed", 1)
        engine = self.crawler.engine
        if engine is not None:
            asyncio.ensure_future(engine.close_spider_async(reason="proxy_auth_failed"))


def _wait(request: Request, delay: float, fclass: FailureClass, reason: str) -> Request:
    """Send the request back to Redis for *delay* seconds without spending an attempt."""
    request.meta[metakeys.OUTCOME] = Verdict.retry(fclass, reason, delay)
    return request.replace(dont_filter=True)
