"""Where proxies come from: one tunnel proxy whose session rotates, or a pool of proxies
fetched from an API (:mod:`scrapy_ha.proxy` holds the middleware that uses them)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote, urlsplit
from urllib.request import urlopen

from scrapy_ha.codec import mask_url

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from scrapy_ha.config.middlewares import ProxyConfig

logger = logging.getLogger(__name__)

#: Seconds to wait for the proxy list API: long enough for a slow API, short next to a lease.
POOL_FETCH_TIMEOUT = 10
#: Characters of a tunnel session token: enough that two workers never pick the same one.
SESSION_CHARS = 10


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
        self.session = uuid.uuid4().hex[:SESSION_CHARS]
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
        self.session = uuid.uuid4().hex[:SESSION_CHARS]
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

    async def choose(self, shared: Callable[[], Awaitable[dict[str, float]]] | None) -> str | None:
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

    async def fetch(self, shared: Callable[[], Awaitable[dict[str, float]]] | None) -> None:
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
    with urlopen(url, timeout=POOL_FETCH_TIMEOUT) as response:  # noqa: S310 (the user's own API)
        return response.read()  # type: ignore[no-any-return]
