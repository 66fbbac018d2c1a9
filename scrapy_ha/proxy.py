"""Proxy rotation driven by ban signals: a tunnel proxy or a pool fetched from an API.

``scrapy_ha.proxy.ProxyMiddleware`` (downloader middleware at 740, just before Scrapy's
``HttpProxyMiddleware`` at 750, which turns the credentials into the
``Proxy-Authorization`` header) sets ``meta["proxy"]`` on every attempt:

- **tunnel** (``HA_PROXY_MODE = "tunnel"``): one proxy URL with credentials; the provider
  changes the exit. With ``HA_PROXY_SESSION_TEMPLATE`` (e.g. ``"{user}-session-{session}"``)
  a ban puts a new session token in the user name: the exit changes, and since Scrapy keys
  its CONNECT tunnels by the proxy's credentials, HTTPS gets a fresh tunnel instead of the
  kept-alive one. ``HA_PROXY_ROTATE_HEADER`` (``"Name: value"``) is sent with the next plain
  HTTP request after a ban.
- **pool** (``HA_PROXY_MODE = "pool"``): proxies fetched from ``HA_PROXY_POOL_URL`` (a JSON
  list of ``{"ip", "port"}`` or ``"ip:port"``, or ``HA_PROXY_POOL_PARSER``), cached for
  ``HA_PROXY_POOL_TTL``, used in turn; a proxy that was banned or failed is out of rotation
  for ``HA_PROXY_COOLDOWN`` on every worker (shared through Redis); an exhausted pool is
  fetched again; when none is usable the request waits in Redis (or goes direct with
  ``HA_PROXY_ALLOW_DIRECT``).

Ban signals are the retry classification's: ``banned`` and ``rate_limited`` responses, and
``network`` errors through the proxy. A 407 from the proxy is a configuration error: one
ERROR naming the proxy (password masked), and the crawl stops (the request is kept).
Credentials never reach Redis, logs, stats or the dead-letter queue.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit
from urllib.request import urlopen

from scrapy.core.downloader.handlers.http11 import TunnelError
from scrapy.exceptions import NotConfigured
from scrapy.utils.misc import load_object

from scrapy_ha import metakeys
from scrapy_ha.codec import mask_url
from scrapy_ha.config import ConfigError
from scrapy_ha.retry import RetryConfig

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Self

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

#: Proxy list cache: extraction APIs rotate their lists about this often and rate-limit callers.
DEFAULT_POOL_TTL = 30.0
#: How long a banned or failing proxy stays out of rotation.
DEFAULT_COOLDOWN = 300.0
#: Consecutive connection failures before a pool proxy is cooled down.
DEFAULT_MAX_FAILURES = 2
#: Seconds a request waits in Redis when no proxy can be had.
NO_PROXY_DELAY = 30.0
#: Seconds a request waits when choosing its proxy failed (Redis or the pool API down):
#: long enough for a blip to pass, short next to a lease.
PROXY_ERROR_DELAY = 5.0
#: Proxies with stats of their own (``ha/proxy/<id>/...``); the rest are counted under
#: ``ha/proxy/other/...``, so a pool that hands out thousands of IPs keeps the stats small.
MAX_PROXY_STATS = 100
#: The status of a refused CONNECT, as Scrapy's TunnelError words it:
#: "Could not open CONNECT tunnel with proxy host:port [{'status': 407, 'reason': '...'}]".
_TUNNEL_STATUS = re.compile(r"\[\{'status': (\d{3}), 'reason': ")
#: A proxy's answer when its credentials are refused.
PROXY_AUTH_REQUIRED = 407


@dataclass(frozen=True)
class ProxyConfig:
    mode: str
    url: str = ""
    session_template: str = ""
    rotate_header: tuple[str, str] | None = None
    pool_url: str = ""
    pool_parser: Callable[[bytes], list[str]] | None = None
    pool_ttl: float = DEFAULT_POOL_TTL
    cooldown: float = DEFAULT_COOLDOWN
    max_failures: int = DEFAULT_MAX_FAILURES
    allow_direct: bool = False

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self | None:
        mode = settings.get("HA_PROXY_MODE") or os.environ.get("HA_PROXY_MODE")
        if not mode:
            return None
        if mode not in ("tunnel", "pool"):
            raise ConfigError(f"HA_PROXY_MODE={mode!r} must be 'tunnel', 'pool' or None")
        config = cls(
            mode=mode,
            url=_tunnel_url(settings) if mode == "tunnel" else "",
            session_template=settings.get("HA_PROXY_SESSION_TEMPLATE") or "",
            rotate_header=_header(settings.get("HA_PROXY_ROTATE_HEADER")),
            pool_url=settings.get("HA_PROXY_POOL_URL") or os.environ.get("HA_PROXY_POOL_URL", ""),
            pool_parser=_parser(settings.get("HA_PROXY_POOL_PARSER")),
            pool_ttl=settings.getfloat("HA_PROXY_POOL_TTL", DEFAULT_POOL_TTL),
            cooldown=settings.getfloat("HA_PROXY_COOLDOWN", DEFAULT_COOLDOWN),
            max_failures=settings.getint("HA_PROXY_MAX_FAILURES", DEFAULT_MAX_FAILURES),
            allow_direct=settings.getbool("HA_PROXY_ALLOW_DIRECT", False),
        )
        if mode == "pool" and not config.pool_url:
            raise ConfigError("HA_PROXY_MODE='pool' needs HA_PROXY_POOL_URL (the proxy list API)")
        if config.session_template and "{session}" not in config.session_template:
            raise ConfigError(
                f"HA_PROXY_SESSION_TEMPLATE={config.session_template!r} must contain {{session}}"
            )
        return config


def _tunnel_url(settings: BaseSettings) -> str:
    """The tunnel proxy from HA_PROXY_URL, or HA_PROXY_HOST/PORT/USER/PASSWORD (settings or
    environment variables of the same names)."""

    def get(name: str) -> str:
        return str(settings.get(name) or os.environ.get(name) or "")

    url = get("HA_PROXY_URL")
    if not url:
        host, port = get("HA_PROXY_HOST"), get("HA_PROXY_PORT")
        if not (host and port):
            raise ConfigError(
                "HA_PROXY_MODE='tunnel' needs HA_PROXY_URL or HA_PROXY_HOST and HA_PROXY_PORT "
                "(settings or environment variables)"
            )
        url = f"http://{host}:{port}"
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if not parts.hostname or not parts.port:
        raise ConfigError(f"HA_PROXY_URL={mask_url(url)!r} needs a host and a port")
    user = get("HA_PROXY_USER") or unquote(parts.username or "")
    password = get("HA_PROXY_PASSWORD") or unquote(parts.password or "")
    auth = f"{quote(user, safe='')}:{quote(password, safe='')}@" if user else ""
    return f"{parts.scheme}://{auth}{parts.hostname}:{parts.port}"


def _header(value: Any) -> tuple[str, str] | None:
    if not value:
        return None
    name, sep, val = str(value).partition(":")
    if not sep or not name.strip():
        raise ConfigError(f"HA_PROXY_ROTATE_HEADER={value!r} must look like 'Name: value'")
    return name.strip(), val.strip()


def _parser(path: Any) -> Callable[[bytes], list[str]] | None:
    if not path:
        return None
    try:
        return load_object(path) if isinstance(path, str) else path  # type: ignore[no-any-return]
    except (ImportError, AttributeError, ValueError, NameError) as exc:
        raise ConfigError(f"HA_PROXY_POOL_PARSER={path!r} cannot be imported: {exc}") from None


def proxy_id(url: str) -> str:
    """``host:port``: how a proxy appears in logs, stats and Redis."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}"


def parse_pool(body: bytes) -> list[str]:
    """Default pool format: a JSON list of ``{"ip": ..., "port": ...}`` or ``"ip:port"``."""
    doc = json.loads(body)
    if isinstance(doc, dict):
        doc = doc.get("data") or doc.get("proxies") or []
    proxies = []
    for entry in doc:
        if isinstance(entry, dict):
            proxies.append(f"http://{entry['ip']}:{entry['port']}")
        else:
            proxies.append(entry if "://" in str(entry) else f"http://{entry}")
    return proxies


class TunnelProxy:
    """One proxy URL; a ban puts a new session token in the user name."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        parts = urlsplit(config.url)
        self.user = unquote(parts.username or "")
        self.password = unquote(parts.password or "")
        self.host = f"{parts.hostname}:{parts.port}"
        self.scheme = parts.scheme
        self.session = uuid.uuid4().hex[:10]
        self.rotate_next = False

    def url(self) -> str:
        user = self.user
        if self.config.session_template:
            user = self.config.session_template.format(user=self.user, session=self.session)
        if not user:
            return f"{self.scheme}://{self.host}"
        return f"{self.scheme}://{quote(user, safe='')}:{quote(self.password, safe='')}@{self.host}"

    def rotate(self, used_session: str | None) -> bool:
        """New exit, unless another ban already rotated past the session that failed."""
        if used_session is not None and used_session != self.session:
            return False
        self.session = uuid.uuid4().hex[:10]
        self.rotate_next = True
        return True


class ProxyPool:
    """Proxies from an extraction API, used in turn, with shared cool-downs."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.proxies: list[str] = []
        self.fetched_at = 0.0
        self.index = 0
        self.cooling: dict[str, float] = {}  # proxy id -> until (time.time())
        self.failures: dict[str, int] = {}

    async def choose(self, shared: Callable[[], Any] | None) -> str | None:
        if time.monotonic() - self.fetched_at > self.config.pool_ttl or not self.proxies:
            await self.fetch(shared)
        proxy = self._next_healthy()
        if proxy is None:
            await self.fetch(shared)  # exhausted: the provider may have new ones
            proxy = self._next_healthy()
        return proxy

    def _prune(self) -> None:
        """Forget cool-downs that are over and failures of proxies the list no longer has."""
        now = time.time()
        self.cooling = {pid: until for pid, until in self.cooling.items() if until > now}
        listed = {proxy_id(p) for p in self.proxies}
        self.failures = {pid: n for pid, n in self.failures.items() if pid in listed}

    def _next_healthy(self) -> str | None:
        now = time.time()
        for _ in range(len(self.proxies)):
            proxy = self.proxies[self.index % len(self.proxies)]
            self.index += 1
            if self.cooling.get(proxy_id(proxy), 0) <= now:
                return proxy
        return None

    async def fetch(self, shared: Callable[[], Any] | None) -> None:
        try:
            body = await asyncio.to_thread(_get, self.config.pool_url)
            parse = self.config.pool_parser or parse_pool
            self.proxies = list(parse(body))
        except Exception as exc:
            shown = mask_url(self.config.pool_url)
            logger.error(
                "Could not fetch the proxy list from %s: %s",
                shown,
                str(exc).replace(self.config.pool_url, shown),
            )
        self.fetched_at = time.monotonic()
        self._prune()
        if shared is not None:
            self.cooling.update(await shared())
        logger.debug(
            "Proxy pool: %d proxies, %d cooling down",
            len(self.proxies),
            sum(1 for t in self.cooling.values() if t > time.time()),
        )

    def cool_down(self, pid: str) -> float:
        until = time.time() + self.config.cooldown
        self.cooling[pid] = until
        self.failures.pop(pid, None)
        return until


def _get(url: str) -> bytes:
    with urlopen(url, timeout=10) as response:  # noqa: S310 (the user's own API)
        return response.read()  # type: ignore[no-any-return]


class ProxyMiddleware:
    """Sets ``meta["proxy"]`` on every attempt and rotates on ban signals."""

    def __init__(self, crawler: Crawler, config: ProxyConfig, retry_config: RetryConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.retry_config = retry_config
        self.stats = crawler.stats
        self.tunnel = TunnelProxy(config) if config.mode == "tunnel" else None
        self.pool = ProxyPool(config) if config.mode == "pool" else None
        self._auth_failed = False
        self._warned_header = False
        self._warned_redis = False
        self._stat_ids: set[str] = set()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = ProxyConfig.from_settings(crawler.settings)
        if config is None:
            raise NotConfigured  # no proxy configured: silent (Scrapy warns if given a reason)
        return cls(crawler, config, RetryConfig.from_settings(crawler.settings))

    async def process_request(self, request: Request) -> Request | None:
        if request.meta.get("dont_proxy"):
            return None
        try:
            url = self.tunnel.url() if self.tunnel else await self._from_pool()
        except Exception as exc:  # never let a middleware's own failure end the request
            logger.warning(
                "Could not choose a proxy for %s (%s): it waits %.0f s in the queue",
                request,
                exc,
                PROXY_ERROR_DELAY,
            )
            self.stats.inc_value("ha/proxy/errors")
            return _wait(request, PROXY_ERROR_DELAY, "proxy_error", f"choosing a proxy: {exc}")
        if url is None:
            return self._no_proxy(request)
        pid = proxy_id(url)
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
        if response.status == PROXY_AUTH_REQUIRED and metakeys.PROXY in request.meta:
            return self._proxy_auth_failed(request, f"HTTP 407 from {request.meta[metakeys.PROXY]}")
        cls = self.retry_config.classify_response(response)
        if cls in ("banned", "rate_limited"):
            self._ban(request, cls)
        return response

    def process_exception(self, request: Request, exception: Exception) -> Request | None:
        if metakeys.PROXY not in request.meta:
            return None
        if tunnel_status(exception) == PROXY_AUTH_REQUIRED:  # CONNECT refused: credentials
            return self._proxy_auth_failed(request, f"CONNECT answered {PROXY_AUTH_REQUIRED}")
        if self.retry_config.classify_exception(exception) == "network":
            self._failure(request)
        return None

    async def _from_pool(self) -> str | None:
        assert self.pool is not None
        return await self.pool.choose(self._shared_cooldowns)

    def _rotation_header(self, request: Request) -> None:
        assert self.tunnel is not None
        if not (self.tunnel.rotate_next and self.config.rotate_header):
            return
        self.tunnel.rotate_next = False
        name, value = self.config.rotate_header
        request.headers[name] = value
        if (
            request.url.startswith("https")
            and not self._warned_header
            and not (self.config.session_template)
        ):
            self._warned_header = True
            logger.warning(
                "HA_PROXY_ROTATE_HEADER cannot reach the proxy inside an HTTPS "
                "tunnel: set HA_PROXY_SESSION_TEMPLATE to rotate HTTPS exits"
            )

    def _ban(self, request: Request, cls: str) -> None:
        pid = request.meta.get(metakeys.PROXY)
        if pid is None:
            return
        self._stat(pid, "bans")
        self._rotate(request, pid, f"{cls} ({request.url})")

    def _failure(self, request: Request) -> None:
        pid = request.meta[metakeys.PROXY]
        self._stat(pid, "failures")
        if self.pool is not None:
            self.pool.failures[pid] = self.pool.failures.get(pid, 0) + 1
            if self.pool.failures[pid] < self.config.max_failures:
                return
        self._rotate(request, pid, "connection failures")

    def _rotate(self, request: Request, pid: str, why: str) -> None:
        if self.tunnel is not None:
            if self.tunnel.rotate(request.meta.get(metakeys.PROXY_SESSION)):
                self.stats.inc_value("ha/proxy/rotations")
                logger.info("Rotating the tunnel proxy's exit after %s", why)
            return
        assert self.pool is not None
        self.pool.cool_down(pid)
        self.stats.inc_value("ha/proxy/rotations")
        logger.info("Proxy %s out of rotation for %.0f s after %s", pid, self.config.cooldown, why)
        asyncio.ensure_future(self._share_cooldown(pid))

    def _no_proxy(self, request: Request) -> Request | None:
        if self.config.allow_direct:
            for key in ("proxy", metakeys.PROXY):  # a retry still carries its last proxy
                request.meta.pop(key, None)
            self.stats.inc_value("ha/proxy/direct")
            return None
        self.stats.inc_value("ha/proxy/unavailable")
        logger.error(
            "No usable proxy for %s (pool empty or all cooling down): it waits %.0f s "
            "in the queue (HA_PROXY_ALLOW_DIRECT=False)",
            request,
            NO_PROXY_DELAY,
        )
        return _wait(request, NO_PROXY_DELAY, "no_proxy", "no usable proxy")

    def _proxy_auth_failed(self, request: Request, detail: str) -> Request:
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
            self.stats.set_value("ha/proxy/auth_failed", 1)
            engine = self.crawler.engine
            if engine is not None:
                asyncio.ensure_future(engine.close_spider_async(reason="proxy_auth_failed"))
        return _wait(request, 60.0, "proxy_auth", "the proxy rejected its credentials (407)")

    async def _shared_cooldowns(self) -> dict[str, float]:
        """Other workers' cool-downs (until, on this worker's clock); expired ones are
        deleted. Shared health is an optimisation: a Redis error leaves the local view."""
        client, key, server_ms = self._redis()
        if client is None:
            return {}
        try:
            raw = await client.hgetall(key)
            expired = [k for k, v in raw.items() if _ms(v) <= server_ms]
            if expired:
                await client.hdel(key, *expired)
        except Exception as exc:
            self._redis_failed("read the shared proxy cool-downs", exc)
            return {}
        offset = time.time() - server_ms / 1000  # server -> local clock
        return {k.decode(): _ms(v) / 1000 + offset for k, v in raw.items() if _ms(v) > server_ms}

    async def _share_cooldown(self, pid: str) -> None:
        """Score by the Redis server's clock (workers' clocks differ); the hash expires
        with its newest cool-down, so it never outlives its use."""
        client, key, server_ms = self._redis()
        if client is None:
            return
        cooldown_ms = int(self.config.cooldown * 1000)
        try:
            async with client.pipeline(transaction=True) as pipe:
                pipe.hset(key, pid, server_ms + cooldown_ms)
                pipe.pexpire(key, cooldown_ms)
                await pipe.execute()
        except Exception as exc:  # never fail a request for it
            self._redis_failed(f"share the cool-down of {pid}", exc)

    def _redis_failed(self, what: str, exc: Exception) -> None:
        self.stats.inc_value("ha/proxy/redis_errors")
        if not self._warned_redis:
            self._warned_redis = True
            logger.warning(
                "Could not %s in Redis (%s): this worker goes on with its own view "
                "of the proxies' health",
                what,
                exc,
            )

    def _redis(self) -> tuple[Any, str, int]:
        from scrapy_ha.scheduler import scheduler_for

        scheduler = scheduler_for(self.crawler)
        if scheduler is None or scheduler.queue is None:
            return None, "", 0
        keys = scheduler.queue.keys
        return scheduler.queue.client, keys.proxy_cooldowns, scheduler.server_time_ms()


def tunnel_status(exception: BaseException) -> int | None:
    """The status a proxy answered to CONNECT, from Scrapy's :class:`TunnelError`."""
    if not isinstance(exception, TunnelError):
        return None
    match = _TUNNEL_STATUS.search(str(exception))
    return int(match.group(1)) if match else None


def _ms(value: bytes) -> float:
    try:
        return float(value)
    except ValueError:
        return 0.0  # garbage: treated as expired, and deleted


def _wait(request: Request, delay: float, cls: str, reason: str) -> Request:
    """Send the request back to Redis for *delay* seconds without spending an attempt."""
    request.meta[metakeys.OUTCOME] = {"op": "retry", "delay": delay, "class": cls, "reason": reason}
    return request.replace(dont_filter=True)
