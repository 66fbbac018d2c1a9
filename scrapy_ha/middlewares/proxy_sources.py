"""Where proxies come from: one tunnel proxy whose session rotates, or a pool of proxies
fetched from an API (:mod:`scrapy_ha.proxy` holds the middleware that uses them)."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import re
import time
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit
from urllib.request import HTTPRedirectHandler, Request, build_opener

from scrapy.core.downloader.handlers.http11 import TunnelError
from scrapy.exceptions import DownloadTimeoutError
from twisted.internet import error
from w3lib.http import basic_auth_header

from scrapy_ha.codec.masking import MASK, mask_text, mask_url, split_userinfo

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from scrapy.statscollectors import StatsCollector

    from scrapy_ha.config.middlewares import ProxyConfig

    #: The other workers' cool-downs (proxy id -> until, on this worker's clock).
    Shared = Callable[[], Awaitable[dict[str, float]]]

logger = logging.getLogger(__name__)

#: Seconds to wait for the proxy list API: long enough for a slow API, short next to a lease.
POOL_FETCH_TIMEOUT = 10
#: Seconds before the list is fetched again after a failed fetch, doubled with each failure
#: in a row: the first retry as soon as a request waiting for a proxy comes back
#: (PROXY_ERROR_DELAY), never hammering an API that is down.
POOL_RETRY_MIN = 5.0
#: The longest wait between two fetches while they fail (the retry backoff's cap).
POOL_RETRY_MAX = 120.0
#: A download that took too long through the proxy: the site's doing as much as the proxy's
#: (Scrapy before 2.17 raised Twisted's error for a connection that timed out).
TIMEOUTS = (DownloadTimeoutError, error.TimeoutError)
#: Characters of a tunnel session token: enough that two workers never pick the same one.
SESSION_CHARS = 10


@functools.lru_cache(maxsize=4096)  # (a pool's list, per request: parsed once)
def proxy_id(url: str, *, user: bool = False) -> str:
    """``host:port``: how a proxy appears in logs, stats and Redis; with *user*, a pool's
    entry, ``<digest>@host:port`` when it has a user name (8 hex digits of its SHA-256,
    never the name: some providers' user name is the secret itself, ``http://TOKEN:@gw``):
    a gateway's sessions listed as proxies of their own (``cust-session-a:pw@gw:port``,
    ``cust-session-b:pw@gw:port``) are banned and cooled one by one, not all with the
    first."""
    parts = urlsplit(url)
    plain = f"{parts.hostname}:{parts.port}"
    if not (user and parts.username):
        return plain
    return f"{hashlib.sha256(parts.username.encode()).hexdigest()[:8]}@{plain}"


def parse_pool(body: bytes) -> list[str]:
    """Default pool format: a JSON list of ``{"ip": ..., "port": ...}`` or ``"ip:port"``
    (or of ``scheme://host:port`` URLs). An entry that is no proxy comes out as a URL that
    :func:`valid_proxy` refuses, so that it costs itself alone. An answer that holds no
    list (an API's error object, ``{"code": 429, "msg": ...}``, answered with a 200) is a
    failed fetch: before, it emptied the list until the TTL was over."""
    doc = json.loads(body)
    if isinstance(doc, dict):
        doc = next((doc[key] for key in ("data", "proxies") if isinstance(doc.get(key), list)), doc)
    if not isinstance(doc, list):
        raise ValueError(f"the answer holds no list of proxies (a JSON {type(doc).__name__})")
    return [_entry_url(entry) for entry in doc]


def _entry_url(entry: Any) -> str:
    if isinstance(entry, dict):
        return f"http://{entry.get('ip', '')}:{entry.get('port', '')}"
    return entry if "://" in str(entry) else f"http://{entry}"


def valid_proxy(entry: Any) -> bool:
    """Is *entry* an ``http://`` or ``https://`` proxy URL with a host and a port (1 to
    65535)? A list's other entries are dropped one by one."""
    if not isinstance(entry, str):
        return False
    try:
        parts = urlsplit(entry)
        port = parts.port
    except ValueError:  # a port that is no number, or out of range
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname) and bool(port)


#: Cool-downs held before those that are over are forgotten (then again at twice as many as
#: are left): a tunnel's are one per site that banned it, a broad crawl's sites by the
#: thousand, and nothing else prunes them.
PRUNED_AT = 1024


class ProxyHealth:
    """Proxies out of rotation (cooling down) and their failures in a row: a pool's, and
    the tunnel's with ``HA_PROXY_ALLOW_DIRECT`` (its requests go direct meanwhile)."""

    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        #: proxy id (out for every site), or "<proxy id> <host>" (a site banned it) ->
        #: until (time.time()): see :func:`cooling_key`
        self.cooling: dict[str, float] = {}
        #: proxy id -> the site of each of its failures in a row ("" a failure of its own)
        self.failures: dict[str, list[str]] = {}
        self._prune_at = PRUNED_AT

    def out(self, pid: str, host: str, now: float) -> bool:
        """Is *pid* cooling down, for every site or for *host*'s?"""
        cooling = self.cooling
        return cooling.get(pid, 0) > now or cooling.get(cooling_key(pid, host), 0) > now

    def failed(self, pid: str, site: str = "") -> str | None:
        """Count a failure of *pid*: its own (a refused connection...), or with *site* a
        timeout there, which a site that holds its answers back (a tarpit) causes through
        every proxy. None until ``HA_PROXY_MAX_FAILURES`` in a row; then where to cool it
        down: that site when each failure of the row timed out there, else every site ("")
        (before, a site that timed out took each proxy from every site in turn)."""
        sites = self.failures.setdefault(pid, [])
        sites.append(site)
        if len(sites) < self.config.max_failures:
            return None
        if site and set(sites) == {site}:
            # the row goes on (an answer ends it): a timeout at another site next is the
            # proxy's (before, it was cooled a site at a time while it hung for every one)
            del sites[: -self.config.max_failures or len(sites)]
            return site
        del self.failures[pid]
        return ""

    def cool_down(self, pid: str, host: str = "") -> float:
        """Take *pid* out of rotation for ``HA_PROXY_COOLDOWN``: for *host*'s site alone
        (a site banned it), else for every site (it failed, or refused its credentials)."""
        now = time.time()
        until = now + self.config.cooldown
        cooling = self.cooling
        cooling[cooling_key(pid, host)] = until
        if len(cooling) >= self._prune_at:
            self.cooling = {key: end for key, end in cooling.items() if end > now}
            self._prune_at = max(PRUNED_AT, 2 * len(self.cooling))
        if not host:  # back in rotation with no failure counted (see MAX_FAILURES)
            self.failures.pop(pid, None)
        return until


class TunnelProxy(ProxyHealth):
    """One proxy URL; a ban puts a new session token in the user name."""

    def __init__(self, config: ProxyConfig) -> None:
        super().__init__(config)
        parts = urlsplit(config.url)
        self.user = unquote(parts.username or "")
        self.password = unquote(parts.password or "")
        host = parts.hostname or ""
        self.host = f"[{host}]:{parts.port}" if ":" in host else f"{host}:{parts.port}"
        self.scheme = parts.scheme
        self.session = uuid.uuid4().hex[:SESSION_CHARS]
        self.rotate_next = False
        self.id = proxy_id(config.url)  # as its attempts' meta key names it

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


class ProxyPool(ProxyHealth):
    """Proxies from an extraction API, used in turn, with shared cool-downs.

    The list is fetched once per ``HA_PROXY_POOL_TTL``, by one fetch at a time, in the
    background: requests are served from the list at hand (however old) while it runs;
    only a pool that never had a list waits for it. A list that is empty, or whose
    proxies all cool down, is kept until its TTL is over. A fetch that fails keeps the
    list at hand and is tried again after ``POOL_RETRY_MIN`` seconds, doubled with each
    failure in a row up to ``POOL_RETRY_MAX``; one ERROR per run of failures.
    """

    def __init__(self, config: ProxyConfig, stats: StatsCollector | None = None) -> None:
        super().__init__(config)
        self.stats = stats
        self.api = PoolApi(config.pool_url)
        self.proxies: list[str] = []
        self.loaded = False  # a list was fetched at least once
        self.next_fetch = 0.0  # time.monotonic() before which no fetch starts
        self.error: str | None = None  # the last fetch's error (masked) while they fail
        self.failed_in_row = 0
        self.index = 0
        self._fetching: asyncio.Future[None] | None = None
        self._warned_entries = False

    async def choose(self, shared: Shared | None, host: str = "") -> str | None:
        """The next proxy not cooling down, for every site or for *host*'s; None if there
        is none (yet)."""
        if self._fetching is None and time.monotonic() >= self.next_fetch:
            self._fetching = asyncio.ensure_future(self.fetch(shared))
        if not self.loaded and self._fetching is not None:
            await asyncio.shield(self._fetching)  # nothing to serve yet: wait for the list
        return self._next_healthy(host)

    def retry_in(self) -> float:
        """Seconds until the next fetch may start."""
        return max(0.0, self.next_fetch - time.monotonic())

    def _prune(self) -> None:
        """Forget cool-downs that are over and failures of proxies the list no longer has."""
        now = time.time()
        self.cooling = {pid: until for pid, until in self.cooling.items() if until > now}
        listed = {proxy_id(p, user=True) for p in self.proxies}
        self.failures = {pid: n for pid, n in self.failures.items() if pid in listed}

    def _next_healthy(self, host: str) -> str | None:
        now = time.time()
        for _ in range(len(self.proxies)):
            proxy = self.proxies[self.index % len(self.proxies)]
            self.index += 1
            # (and by its host:port alone, as workers of an earlier version name it)
            if not any(
                self.out(pid, host, now) for pid in {proxy_id(proxy, user=True), proxy_id(proxy)}
            ):
                return proxy
        return None

    async def fetch(self, shared: Shared | None) -> None:
        """Fetch the list (never raises: a failure keeps the list at hand), then merge the
        other workers' cool-downs."""
        try:
            try:
                body = await asyncio.to_thread(self.api.get)
                self._fetched(list((self.config.pool_parser or parse_pool)(body)))
            except Exception as exc:
                self._failed(exc)
            self._prune()
            if shared is not None:
                self.cooling.update(await shared())
        finally:
            self._fetching = None
        logger.debug(
            "Proxy pool: %d proxies, %d cooling down",
            len(self.proxies),
            sum(1 for t in self.cooling.values() if t > time.time()),
        )

    def _fetched(self, entries: list[Any]) -> None:
        proxies = [entry for entry in entries if valid_proxy(entry)]
        if len(proxies) < len(entries):
            self._bad_entries([e for e in entries if not valid_proxy(e)])
        if self.failed_in_row:
            logger.info(
                "The proxy list API %s answers again (after %d failed fetches)",
                self.api.shown,
                self.failed_in_row,
            )
        self.proxies, self.loaded, self.error, self.failed_in_row = proxies, True, None, 0
        self.next_fetch = time.monotonic() + self.config.pool_ttl
        self._count("ha/proxy/pool_fetches")

    def _bad_entries(self, bad: list[Any]) -> None:
        self._count("ha/proxy/pool_bad_entries", len(bad))
        log = logger.debug if self._warned_entries else logger.warning
        self._warned_entries = True
        log(
            "Dropped %d of the proxy list's entries from %s that are no http(s)://host:port "
            "proxy (the first: %s); the others are used",
            len(bad),
            self.api.shown,
            self.api.mask(repr(bad[0])[:200]),
        )

    def _failed(self, exc: Exception) -> None:
        self.failed_in_row += 1
        wait = min(POOL_RETRY_MIN * 2 ** (self.failed_in_row - 1), POOL_RETRY_MAX)
        self.next_fetch = time.monotonic() + wait
        self.error = self.api.mask(f"{type(exc).__name__}: {exc}")
        self._count("ha/proxy/pool_errors")
        log = logger.error if self.failed_in_row == 1 else logger.debug
        log(
            "Could not fetch the proxy list from HA_PROXY_POOL_URL=%s (%s): %s; tried again "
            "in %.0f s (doubling while it fails, up to %.0f s)",
            self.api.shown,
            self.error,
            "the last list is used meanwhile" if self.loaded else "requests wait in Redis",
            wait,
            POOL_RETRY_MAX,
        )

    def _count(self, key: str, n: int = 1) -> None:
        if self.stats is not None:
            self.stats.inc_value(key, n)


def cooling_key(pid: str, host: str = "") -> str:
    """How a cool-down of proxy *pid* is kept, here and in Redis (``Keys.proxy_cooldowns``):
    its id for every site; ``"<id> <host>"`` for one site (a host holds no space). A ban is
    a site's verdict on the proxy's address: before, a 403 from one site took the proxy
    from every site of the crawl for ``HA_PROXY_COOLDOWN``."""
    return f"{pid} {host}" if host else pid


class PoolApi:
    """``HA_PROXY_POOL_URL`` as it is fetched: a ``user:password`` in it is sent as Basic
    auth (``urlopen`` would take it for the host), and never shown."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.shown = mask_url(url)
        self.headers: dict[str, str] = {}
        self.secrets = [url]
        split = split_userinfo(url)
        if split is not None:
            scheme, userinfo, host, rest = split
            user, _, password = userinfo.partition(":")
            self.url = f"{scheme}{host}{rest}"
            auth = basic_auth_header(unquote(user), unquote(password))
            self.headers["Authorization"] = auth.decode("latin-1")
            self.secrets = [url, userinfo, password, unquote(password), auth.decode("latin-1")]

    def get(self) -> bytes:
        """The list's body (blocking: run it in a thread)."""
        return _get(Request(self.url, headers=self.headers))

    def mask(self, text: str) -> str:
        """*text* (an error, an entry) fit to print: the URL masked, the password gone."""
        for secret in sorted(filter(None, self.secrets), key=len, reverse=True):
            text = text.replace(secret, self.shown if secret == self.secrets[0] else MASK)
        return mask_text(text)


def _get(request: Request) -> bytes:
    opener = build_opener(_OwnOriginRedirect())
    with opener.open(request, timeout=POOL_FETCH_TIMEOUT) as response:
        return response.read()  # type: ignore[no-any-return]


class _OwnOriginRedirect(HTTPRedirectHandler):
    """The API's redirects followed, its credentials sent to its own origin alone (scheme,
    host and port): urllib sent them on to whatever host a redirect named."""

    def redirect_request(
        self, req: Request, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and _origin(new.full_url) != _origin(req.full_url):
            new.remove_header("Authorization")
        return new


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port


#: The status of a refused CONNECT, as Scrapy's TunnelError words it:
#: "Could not open CONNECT tunnel with proxy host:port [{'status': 407, 'reason': '...'}]".
_TUNNEL_STATUS = re.compile(r"\[\{'status': (\d{3}), 'reason': ")


def tunnel_status(exception: BaseException) -> int | None:
    """The status a proxy answered to CONNECT, from Scrapy's :class:`TunnelError`."""
    if not isinstance(exception, TunnelError):
        return None
    match = _TUNNEL_STATUS.search(str(exception))
    return int(match.group(1)) if match else None
