"""The Redis settings as scrapy-redis reads them (``REDIS_PARAMS``, ``REDIS_ENCODING``,
``REDIS_HOST``/``REDIS_PORT``/``REDIS_DB``, lists of nodes) and the address of a URL,
checked before a client is made: a value redis-py cannot use failed at the first command,
with a traceback (a text for a timeout, an encoding Python does not have, an argument it
does not take), was blamed on REDIS_URL or reported as a Redis that cannot be reached, or
(a password holding an unencoded ``#``) had redis-py's error quote part of the password."""

from __future__ import annotations

import contextlib
import math
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from scrapy_ha.codec import mask_url
from scrapy_ha.config.validate import ConfigError

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from scrapy.settings import BaseSettings

__all__ = [
    "SCRAPY_REDIS_ENCODING",
    "TIMEOUT_PARAMS",
    "RedisConfigError",
    "check_address",
    "parse_nodes",
    "check_query",
    "check_timeout",
    "own_class",
    "redis_params",
    "refused_arguments",
    "settings_url",
    "whole_setting",
]

#: scrapy-redis's own defaults for ``REDIS_PARAMS``, honoured here.
SCRAPY_REDIS_ENCODING = "utf-8"
#: The arguments of ``REDIS_PARAMS`` that are seconds.
TIMEOUT_PARAMS = ("socket_timeout", "socket_connect_timeout", "health_check_interval")
#: The shortest socket timeout a connection is made with (seconds; see check_timeout).
MIN_TIMEOUT = 0.001
#: The shortest interval between health checks but 0 (off), in seconds.
MIN_HEALTH_CHECK = 0.1


class RedisConfigError(ConfigError):
    """The Redis settings or URL cannot be used; the message names them and the fix (a
    worker says it as it says any other setting's: not "check REDIS_URL" after it)."""


def redis_params(settings: BaseSettings) -> dict[str, Any]:
    """``REDIS_PARAMS`` as scrapy-redis reads it, ``REDIS_ENCODING`` included."""
    encoding = settings.get("REDIS_ENCODING") or SCRAPY_REDIS_ENCODING
    _text_encoding("REDIS_ENCODING", encoding)
    params: dict[str, Any] = {"encoding": encoding}
    try:
        params.update(settings.getdict("REDIS_PARAMS"))
    except (TypeError, ValueError):
        raise RedisConfigError(
            f"REDIS_PARAMS={settings.get('REDIS_PARAMS')!r} must be a dict (or its JSON text)"
        ) from None
    _text_encoding("REDIS_PARAMS['encoding']", params["encoding"])
    for name in TIMEOUT_PARAMS:
        value = params.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RedisConfigError(f"REDIS_PARAMS[{name!r}]={value!r} must be seconds")
        check_timeout(f"REDIS_PARAMS[{name!r}]", name, value)
    return params


def check_query(url: str) -> None:
    """The timeouts a URL's query gives (``?socket_timeout=0``) checked as those of
    ``REDIS_PARAMS`` are: redis-py reads them, and such a URL skipped the check."""
    for name, text in parse_qsl(urlsplit(url).query, keep_blank_values=True):
        if name in TIMEOUT_PARAMS and text:  # (a blank one: redis-py drops it)
            shown = f"REDIS_URL {mask_url(url)!r}: {name}"
            try:
                value = float(text)
            except ValueError:
                raise RedisConfigError(f"{shown}={text!r} must be seconds") from None
            check_timeout(shown, name, value, given=text)


def check_timeout(shown: str, name: str, value: float, given: Any = None) -> None:
    """Refuse the timeout *name* (one of ``TIMEOUT_PARAMS``) of *value* seconds, said as
    *shown*, when no connection could be made with it: 1e-300 or 1e-9 gave a minute of
    "unreachable", then the start given up, named as an unreachable Redis (1e-4 connected
    after 30 s of warnings, 0.002 at once on one host); and a health check more often than
    every 0.1 s made the connection's own start fail (redis-py's CLIENT SETINFO refused)."""
    health = name == "health_check_interval"
    least = MIN_HEALTH_CHECK if health else MIN_TIMEOUT
    if not (math.isfinite(value) and (value >= least or (health and value == 0))):
        what = f"0 (off) or at least {least:g}" if health else f"{least:g} or more"
        raise RedisConfigError(
            f"{shown}={value if given is None else given!r} must be {what} seconds"
        )


def settings_url(settings: BaseSettings) -> str:
    """The URL of scrapy-redis's ``REDIS_HOST``, ``REDIS_PORT`` and ``REDIS_DB``."""
    host = str(settings.get("REDIS_HOST") or "localhost")
    if "://" in host or host.startswith("unix:"):  # (a review: "holds a port" said of it)
        raise RedisConfigError(
            f"REDIS_HOST={host!r} is a URL: give it as REDIS_URL (REDIS_HOST is a host name "
            "or address alone)"
        )
    if host.count(":") == 1 or "]:" in host:  # (a QA run: 'h:6379' read as an IPv6 address)
        raise RedisConfigError(
            f"REDIS_HOST={host!r} holds a port: give the host alone, and the port as "
            f"REDIS_PORT (or the whole address as REDIS_URL = 'redis://{host}')"
        )
    if ":" in host and not host.startswith("["):  # an IPv6 address
        host = f"[{host}]"
    port = whole_setting(settings, "REDIS_PORT") if settings.get("REDIS_PORT") else 6379
    if not 0 < port < 65536:
        raise RedisConfigError(f"REDIS_PORT={settings.get('REDIS_PORT')!r} must be 1 to 65535")
    return f"redis://{host}:{port}/{whole_setting(settings, 'REDIS_DB')}"


def whole_setting(settings: BaseSettings, name: str) -> int:
    """Setting *name* as a whole number (0 when unset), refused naming it."""
    try:
        return settings.getint(name, 0)
    except (TypeError, ValueError):
        raise RedisConfigError(f"{name}={settings.get(name)!r} must be a whole number") from None


#: What follows the user info of a URL: hosts (``host:port``, comma-separated), then a path.
_HOSTS_THEN_PATH = re.compile(r"[\w.\-\[\]:,]+(?:/\S*)?")


def check_address(url: str, *, one_host: bool = True) -> None:
    """Refuse a URL whose host or port cannot be read, naming it masked. A password holding
    an unencoded ``#``, ``?`` or ``/`` (``redis://:pw#1@host``) ends the URL's address
    there: redis-py's error then quotes part of the password as a port, or connects to it
    as a host and names it (``connecting to pw:6379``). *one_host*: the URL names one
    server (its port is checked too)."""
    try:
        parts = urlsplit(url)
        port = parts.port if one_host else None
    except ValueError:
        port = -1
    head, at, tail = url.partition("://")[2].rpartition("@")
    netloc = f"{head}@{tail.partition('/')[0]}"
    cut = (
        at
        and not url.lower().startswith("unix:")  # a path may hold '@' (redis@main.sock)
        and netloc != parts.netloc
        and "=" not in head
        and _HOSTS_THEN_PATH.fullmatch(tail)
    )
    if port == -1 or port == 0 or cut:
        shown = f"{url.partition('://')[0]}://***@{tail}" if cut else mask_url(url)
        raise RedisConfigError(
            f"REDIS_URL {shown!r}: its host and port cannot be read (a port is a "
            f"number from 1 to 65535, an IPv6 address is written in brackets; a password "
            f"holding '#', '?' or '/' must be percent-encoded: %23, %3F, %2F)"
        )


def _text_encoding(name: str, encoding: Any) -> None:
    """*encoding* is one redis-py can encode text with (``base64`` is a codec, not one)."""
    try:
        "".encode(encoding)
        b"".decode(encoding)
    except (LookupError, TypeError):
        raise RedisConfigError(f"{name}={encoding!r} is not a text encoding") from None


def parse_nodes(
    spec: str | Iterable[Any], default_port: int, what: str
) -> tuple[tuple[str, int], ...]:
    """``"h:p,h:p"``, ``["h:p", ...]`` or ``[("h", p), ...]`` as (host, port) pairs."""
    if not isinstance(spec, (str, list, tuple, set, frozenset)):
        raise RedisConfigError(f"{what}={spec!r} must be 'host:port,host:port' or a list of them")
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    nodes: list[tuple[str, int]] = []
    for item in items:
        if isinstance(item, (tuple, list)):
            if len(item) != 2 or not str(item[1]).isdigit():
                raise RedisConfigError(f"{what}: {item!r} is not host:port")
            nodes.append((str(item[0]), int(item[1])))
            continue
        host, _, port = str(item).strip().rpartition(":")
        if not host:
            host, port = port, str(default_port)
        if not host or not port.isdigit():
            raise RedisConfigError(f"{what}: {item!r} is not host:port")
        nodes.append((host.strip("[]"), int(port)))
    if not nodes:
        raise RedisConfigError(f"{what} names no host:port")
    return tuple(nodes)


#: What a client argument redis-py does not take is blamed on.
ARGUMENTS = "REDIS_PARAMS (or the query of REDIS_URL)"


@contextlib.contextmanager
def refused_arguments() -> Iterator[None]:
    """Turn redis-py's ``TypeError`` for an argument it does not take (met as the client or
    its first connection is made) into a :class:`RedisConfigError` naming the settings."""
    try:
        yield
    except TypeError as exc:
        raise RedisConfigError(f"{ARGUMENTS}: redis-py refused an argument ({exc})") from None


def own_class(cls: Any, base: type) -> Any:
    """The user's ``REDIS_PARAMS["redis_cls"]`` when it is a client of *base*'s kind (a
    subclass of their own); else *base*: scrapy-redis's ``redis.Redis`` names the blocking
    client, and the scheduler needs the asyncio one."""
    if isinstance(cls, str):
        from scrapy.utils.misc import load_object  # (not at import: scrapy_ha.config.bare)

        try:
            cls = load_object(cls)
        except (ImportError, NameError, AttributeError, ValueError) as exc:
            raise RedisConfigError(
                f"REDIS_PARAMS['redis_cls']={cls!r} cannot be imported ({exc})"
            ) from None
    return cls if isinstance(cls, type) and issubclass(cls, base) else base
