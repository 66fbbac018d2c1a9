"""The settings of the proxy, checkpoint, cookie and user-agent middlewares, validated (the
retry middlewares' are in :mod:`scrapy_ha.config.retry`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from scrapy_ha.codec import ALLOWED_SCHEMES_SETTING, DEFAULT_ALLOWED_SCHEMES, mask_url
from scrapy_ha.codec.masking import LOOSE_USERINFO, split_userinfo
from scrapy_ha.config import validate as check
from scrapy_ha.config.items import OUTBOX, items_mode
from scrapy_ha.config.validate import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Self
    from urllib.parse import SplitResult

    from scrapy.settings import BaseSettings


# -- proxies --------------------------------------------------------------------------------

#: Proxy list cache: extraction APIs rotate their lists about this often and rate-limit callers.
DEFAULT_POOL_TTL = 30.0
#: How long a banned or failing proxy stays out of rotation: five minutes lets a ban lift.
DEFAULT_COOLDOWN = 300.0
#: Consecutive connection failures before a pool proxy is cooled down (one may be a blip).
DEFAULT_MAX_FAILURES = 2
#: The proxy modes (HA_PROXY_MODE).
PROXY_MODES = ("tunnel", "pool")
#: URL schemes a proxy list can be fetched from (``urlopen``): an API, or a file on disk.
POOL_URL_SCHEMES = ("http", "https", "file")
#: Proxy schemes Scrapy's HttpProxyMiddleware speaks (no SOCKS).
PROXY_SCHEMES = ("http", "https")
#: The highest TCP port.
MAX_PORT = 65535
#: A URL's scheme and authority (group 1), read without urlsplit, which raises on a bad host.
_AUTHORITY = re.compile(r"[^:/?#]*://([^/?#]*)")


@dataclass(frozen=True)
class ProxyConfig:
    """The proxy settings (or environment variables of the same names), validated."""

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
        """None when no proxy is configured (HA_PROXY_MODE unset)."""
        mode = check.raw_or_env(settings, "HA_PROXY_MODE")
        if not mode:
            return None
        if mode not in PROXY_MODES:
            raise ConfigError(f"HA_PROXY_MODE={mode!r} must be 'tunnel', 'pool' or None")
        return cls(
            mode=mode,
            url=_tunnel_url(settings) if mode == "tunnel" else "",
            session_template=_session_template(settings),
            rotate_header=_header(settings.get("HA_PROXY_ROTATE_HEADER")),
            pool_url=_pool_url(settings, mode),
            pool_parser=check.optional_callable(settings, "HA_PROXY_POOL_PARSER"),
            pool_ttl=check.seconds(settings, "HA_PROXY_POOL_TTL", DEFAULT_POOL_TTL, zero=True),
            cooldown=check.seconds(settings, "HA_PROXY_COOLDOWN", DEFAULT_COOLDOWN, zero=True),
            max_failures=check.whole(settings, "HA_PROXY_MAX_FAILURES", DEFAULT_MAX_FAILURES),
            allow_direct=check.boolean(settings, "HA_PROXY_ALLOW_DIRECT", False),
        )


def _tunnel_url(settings: BaseSettings) -> str:
    """The tunnel proxy from HA_PROXY_URL, or HA_PROXY_HOST/PORT/USER/PASSWORD (settings or
    environment variables of the same names); an error names the setting the user set."""
    url = check.raw_or_env(settings, "HA_PROXY_URL")
    if url:
        full = url if "://" in url else f"http://{url}"
        _unencoded_password("HA_PROXY_URL", full)
        parts = check.url_parts("HA_PROXY_URL", full, mask_url(full))  # (a scheme to mask by)
        scheme, host, port = parts.scheme, _bracketed(parts.hostname), _url_port(parts)
        _check_proxy_scheme(scheme, "HA_PROXY_URL", url)
        if not host or port is None:
            raise ConfigError(
                f"HA_PROXY_URL={mask_url(url)!r} needs a host and a port (1 to {MAX_PORT}); "
                f"percent-encode '/', '?', '#' and '@' in the password, or give it in "
                f"HA_PROXY_PASSWORD"
            )
        url_user, url_password = unquote(parts.username or ""), unquote(parts.password or "")
    else:
        scheme, host, port = "http", _proxy_host(settings), _proxy_port(settings)
        url_user = url_password = ""
    user = check.raw_or_env(settings, "HA_PROXY_USER") or url_user
    password = check.raw_or_env(settings, "HA_PROXY_PASSWORD") or url_password
    auth = f"{quote(user, safe='')}:{quote(password, safe='')}@" if user else ""
    return f"{scheme}://{auth}{host}:{port}"


def _unencoded_password(setting: str, url: str) -> None:
    """Refuse a URL whose host is followed by ``text@host``: a password that holds ``/``,
    ``?`` or ``#`` unencoded (``http://u:1234/56@proxy:8000`` reads as the host ``u``, port
    1234, the password a path), which no masking can tell from a port and a path. The
    error shows nothing of the URL. The pool's URL takes one the masking reads
    (``http://u:pa/ss@api/list``: sent as Basic auth); the tunnel's, which has nothing after
    its host, none: any ``@`` after its host is refused, a host Python cannot read too."""
    authority = _AUTHORITY.match(url)
    if authority is None or "@" in authority[1]:
        return
    if setting == "HA_PROXY_URL":
        loose = "@" in url[authority.end() :]
    else:
        loose = LOOSE_USERINFO.match(url) is not None and split_userinfo(url) is None
    if loose:
        raise ConfigError(
            f"{setting} has an '@' after its host: a password holding '/', '?' or '#' must "
            f"be percent-encoded (%2F, %3F, %23; '@' as %40)"
            + (", or given in HA_PROXY_PASSWORD" if setting == "HA_PROXY_URL" else "")
        )


def _url_port(parts: SplitResult) -> int | None:
    try:
        port = parts.port
    except ValueError:  # not a number, or out of range
        return None
    return port if port and 0 < port <= MAX_PORT else None


def _check_proxy_scheme(scheme: str, name: str, url: str) -> None:
    if scheme not in PROXY_SCHEMES:
        raise ConfigError(
            f"{name}={mask_url(url)!r}: the proxy must be an http:// or https:// proxy "
            f"(Scrapy's HttpProxyMiddleware speaks no {scheme}://)"
        )


def _proxy_host(settings: BaseSettings) -> str:
    host = check.raw_or_env(settings, "HA_PROXY_HOST")
    port = check.raw_or_env(settings, "HA_PROXY_PORT")
    if not (host and port):
        raise ConfigError(
            "HA_PROXY_MODE='tunnel' needs HA_PROXY_URL or HA_PROXY_HOST and HA_PROXY_PORT "
            "(settings or environment variables)"
        )
    given = str(host).strip()
    host = _bracketed(given.removeprefix("[").removesuffix("]")) or ""
    if not given or any(c in host for c in "/?#@ ") or host.count(":") == 1:
        raise ConfigError(
            f"HA_PROXY_HOST={mask_url(given)!r} must be a host name or an IP address alone "
            f"(no scheme, port or credentials: those are HA_PROXY_PORT, HA_PROXY_USER and "
            f"HA_PROXY_PASSWORD)"
        )
    return host


def _bracketed(host: str | None) -> str | None:
    """*host* as a URL writes it: an IPv6 address in brackets (``[::1]``)."""
    return f"[{host}]" if host and ":" in host and not host.startswith("[") else host


def _proxy_port(settings: BaseSettings) -> int:
    port = check.raw_or_env(settings, "HA_PROXY_PORT")
    text = str(port).strip()
    if not text.isdigit() or not 0 < int(text) <= MAX_PORT:
        raise ConfigError(f"HA_PROXY_PORT={port!r} must be a port number from 1 to {MAX_PORT}")
    return int(text)


def _session_template(settings: BaseSettings) -> str:
    template = check.text(settings, "HA_PROXY_SESSION_TEMPLATE", "")
    if not template:
        return ""
    try:
        formatted = template.format(user="u", session="s")
    except (KeyError, IndexError, ValueError):
        formatted = ""
    if "{session}" not in template or not formatted:
        raise ConfigError(
            f"HA_PROXY_SESSION_TEMPLATE={template!r} must contain {{session}} (and may "
            f"contain {{user}}), e.g. '{{user}}-session-{{session}}'"
        )
    return template


def _header(value: Any) -> tuple[str, str] | None:
    if not value:
        return None
    name, sep, val = str(value).partition(":")
    if not sep or not name.strip():
        raise ConfigError(f"HA_PROXY_ROTATE_HEADER={value!r} must look like 'Name: value'")
    return name.strip(), val.strip()


def _pool_url(settings: BaseSettings, mode: str) -> str:
    url = check.raw_or_env(settings, "HA_PROXY_POOL_URL")
    if mode == "pool" and not url:
        raise ConfigError("HA_PROXY_MODE='pool' needs HA_PROXY_POOL_URL (the proxy list API)")
    if url:
        _unencoded_password("HA_PROXY_POOL_URL", url)
    if url and check.url_parts("HA_PROXY_POOL_URL", url, mask_url(url)).scheme not in (
        POOL_URL_SCHEMES
    ):
        raise ConfigError(
            f"HA_PROXY_POOL_URL={mask_url(url)!r} must be an http://, https:// or file:// "
            f"URL (the API, or the file, that lists the proxies)"
        )
    return url


# -- checkpoints, cookies, user agents ------------------------------------------------------

#: Items between two checkpoints within a page: a kill re-emits at most 49 items, at the cost of
#: one small write per 50.
DEFAULT_CHECKPOINT_ITEMS = 50
#: A checkpoint larger than this is refused: a checkpoint says where a task stands, not what
#: it found (that belongs in items).
DEFAULT_CHECKPOINT_MAX_BYTES = 2048
#: Checkpoints expire after a week without a save: long enough for a weekly re-crawl.
DEFAULT_CHECKPOINT_TTL = 7 * 24 * 3600.0
#: The shortest checkpoint TTL: one millisecond, the unit Redis keeps it in (``PX``); a
#: shorter one rounds to 0 ms, which Redis refuses.
MIN_CHECKPOINT_TTL = 0.001
#: The item field whose last value a checkpoint records.
DEFAULT_CHECKPOINT_ID_FIELD = "id"


def allowed_schemes(settings: BaseSettings) -> frozenset[str]:
    """``HA_ALLOWED_SCHEMES``, checked: the schemes of requests a worker takes from Redis
    (and queues), for the scheduler, the checkpoints and ``scrapy-ha push`` alike."""
    return check.schemes(settings, ALLOWED_SCHEMES_SETTING, DEFAULT_ALLOWED_SCHEMES)


@dataclass(frozen=True)
class CheckpointConfig:
    """Pagination checkpoints (HA_CHECKPOINTS); ``every_items=0`` saves at page ends only
    (always with the item outbox, ``HA_ITEMS = "outbox"``: a page's items are committed
    with its ack, so a page redone must emit all of them again)."""

    enabled: bool = False
    every_items: int = DEFAULT_CHECKPOINT_ITEMS
    max_bytes: int = DEFAULT_CHECKPOINT_MAX_BYTES
    ttl: float = DEFAULT_CHECKPOINT_TTL
    rerun: bool = False
    id_field: str = DEFAULT_CHECKPOINT_ID_FIELD
    #: the schemes a resumed page may have (HA_ALLOWED_SCHEMES): checkpoints are in Redis
    schemes: frozenset[str] = DEFAULT_ALLOWED_SCHEMES

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        """Switched off, the other settings are not read (a crawl without checkpoints does
        not fail on a value it never uses)."""
        if not check.boolean(settings, "HA_CHECKPOINTS", False):
            return cls(enabled=False)
        every = check.whole(settings, "HA_CHECKPOINT_ITEMS", DEFAULT_CHECKPOINT_ITEMS, minimum=0)
        return cls(
            enabled=True,
            # with the item outbox no item is out before its page's ack: nothing to skip
            every_items=0 if items_mode(settings) == OUTBOX else every,
            max_bytes=check.whole(
                settings, "HA_CHECKPOINT_MAX_BYTES", DEFAULT_CHECKPOINT_MAX_BYTES
            ),
            ttl=_checkpoint_ttl(settings),
            rerun=check.boolean(settings, "HA_CHECKPOINT_RERUN", False),
            id_field=check.text(settings, "HA_CHECKPOINT_ID_FIELD", DEFAULT_CHECKPOINT_ID_FIELD),
            schemes=allowed_schemes(settings),
        )

    @property
    def ttl_ms(self) -> int:
        return int(self.ttl * 1000)


def _checkpoint_ttl(settings: BaseSettings) -> float:
    """HA_CHECKPOINT_TTL: finite (``inf`` overflows the milliseconds), at least 1 ms."""
    ttl = check.seconds(settings, "HA_CHECKPOINT_TTL", DEFAULT_CHECKPOINT_TTL, finite=True)
    if ttl < MIN_CHECKPOINT_TTL:
        raise ConfigError(
            f"HA_CHECKPOINT_TTL={settings.get('HA_CHECKPOINT_TTL')!r} must be at least "
            f"{MIN_CHECKPOINT_TTL:g} seconds (Redis keeps a TTL in whole milliseconds)"
        )
    return ttl


#: Seconds a crawl's shared cookie jars live in Redis without a worker using them: a week,
#: as checkpoints, so that a crawl stopped for days resumes logged in, while the jars of one
#: that stopped for good do not keep its sessions for ever (a finished crawl clears its jars
#: at once, or drops their session cookies when it persists). A worker that uses a jar
#: refreshes the TTL every quarter of it, so a jar in use never expires.
DEFAULT_COOKIES_TTL = 7 * 24 * 3600.0


@dataclass(frozen=True)
class CookiesConfig:
    """Scrapy's COOKIES_ENABLED / COOKIES_DEBUG, whether jars are shared (HA_SHARED_COOKIES)
    and how long they live unused (HA_COOKIES_TTL; 0: no TTL)."""

    enabled: bool = True
    debug: bool = False
    shared: bool = True
    ttl: float = DEFAULT_COOKIES_TTL

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        """Switched off, the other settings are not read, as Scrapy's own middleware."""
        if not check.boolean(settings, "COOKIES_ENABLED", True, theirs=True):
            return cls(enabled=False)
        return cls(
            enabled=True,
            debug=check.boolean(settings, "COOKIES_DEBUG", False, theirs=True),
            shared=check.boolean(settings, "HA_SHARED_COOKIES", True),
            ttl=check.seconds(settings, "HA_COOKIES_TTL", DEFAULT_COOKIES_TTL, zero=True),
        )


#: In one line of HA_USER_AGENTS given as text, a comma that seems to start another agent
#: (``a,b``, or ``, Mozilla/5.0``): real agents hold commas only as ``KHTML, like Gecko``.
_AGENT_LIST_COMMA = re.compile(r",(?=\S)|,\s*[A-Za-z][\w.\-]*/[0-9]")


@dataclass(frozen=True)
class UserAgentConfig:
    """The User-Agent pool (HA_USER_AGENTS); empty means off."""

    agents: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        """A list, or text (``-s``, scrapyd): a JSON list, or one agent per line. Text
        that could be one agent or several split at commas is refused."""
        value = settings.get("HA_USER_AGENTS")
        if value is not None and not isinstance(value, (str, list, tuple, set, frozenset)):
            raise ConfigError(f"HA_USER_AGENTS={value!r} must be a list of non-empty strings")
        agents = _agents_from_text(settings, value) if isinstance(value, str) else list(value or ())
        if not all(isinstance(a, str) and a.strip() for a in agents):
            raise ConfigError(f"HA_USER_AGENTS={agents!r} must be a list of non-empty strings")
        return cls(tuple(agents))


def _agents_from_text(settings: BaseSettings, text: str) -> list[Any]:
    if text.lstrip().startswith("["):  # a JSON list, read as the other list settings are
        return list(check.names(settings, "HA_USER_AGENTS"))
    if text.lstrip().startswith("{"):  # (a JSON object was taken as one User-Agent)
        raise ConfigError(f"HA_USER_AGENTS={text!r} must be a list of User-Agents, not a dict")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if any(_AGENT_LIST_COMMA.search(line) for line in lines):
        raise ConfigError(
            f"HA_USER_AGENTS={text!r} is ambiguous: one User-Agent holding commas, or "
            f'several separated by commas? Give a JSON list (\'["agent 1", "agent 2"]\') '
            f"or one agent per line"
        )
    return lines
