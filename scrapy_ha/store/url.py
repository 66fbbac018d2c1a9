"""Where the crawl's Redis is, and the one place every scrapy-ha client is built from it.

The scheduler, its lease keeper thread, the middlewares (through the scheduler), the CLI,
the exporter and the dashboard all reach Redis through :func:`async_client` or
:func:`sync_client`, so that one setting moves every one of them. Redis is named by one of:

- ``REDIS_URL`` (or scrapy-redis's ``REDIS_HOST`` / ``REDIS_PORT`` / ``REDIS_DB``):
  ``redis://[user:password@]host:port/db``, ``rediss://...`` (TLS), ``unix:///path?db=N``;
- ``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]``, or the
  settings ``REDIS_SENTINELS`` and ``REDIS_SENTINEL_SERVICE``: the primary is asked of the
  sentinels on every new connection, so a failover is followed by reconnecting;
- ``redis+cluster://[user:password@]host:port[,host:port...]``, or ``REDIS_CLUSTER_NODES``
  (scrapy-redis's ``REDIS_PARAMS["redis_cls"]`` naming a ``RedisCluster`` still works).

The first that is set wins: ``REDIS_SENTINELS``, ``REDIS_CLUSTER_NODES``, ``REDIS_URL``,
``REDIS_HOST``. ``rediss`` in any of these schemes (``rediss+sentinel://``,
``rediss+cluster://``) means TLS, with ``REDIS_TLS_CA_FILE``, ``REDIS_TLS_CERT_FILE`` and
``REDIS_TLS_KEY_FILE``.
``REDIS_PARAMS`` is passed to the client as in scrapy-redis. A password given in a URL is
never printed: :attr:`RedisTarget.display` masks it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel

from scrapy_ha.codec import mask_url
from scrapy_ha.store.answering import ask_answering_nodes, blocking_cluster
from scrapy_ha.store.asking import follow_asks
from scrapy_ha.store.redis_params import (
    RedisConfigError,
    check_address,
    check_query,
    own_class,
    parse_nodes,
    redis_params,
    refused_arguments,
    settings_url,
    whole_setting,
)
from scrapy_ha.store.tls_files import check_client_tls

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = [
    "RedisConfigError",
    "RedisTarget",
    "async_client",
    "sync_client",
    "target_from_settings",
]

#: Where Redis is when nothing says otherwise: redis-py's and scrapy-redis's default.
DEFAULT_URL = "redis://localhost:6379/0"
#: The port of a sentinel given without one (Redis Sentinel's registered port).
SENTINEL_PORT = 26379
#: The port of a Redis (or cluster node) given without one.
REDIS_PORT = 6379
#: Read timeout of one Redis call: a script over a big batch finishes well within it.
DEFAULT_SOCKET_TIMEOUT = 15.0
#: Seconds an idle pooled connection may sit before it is PINGed before use: a connection
#: to a server that went away while idle fails there, not in the middle of a script.
HEALTH_CHECK_INTERVAL = 30

#: Settings naming TLS files, and the redis-py argument each sets.
TLS_SETTINGS = {
    "REDIS_TLS_CA_FILE": "ssl_ca_certs",
    "REDIS_TLS_CERT_FILE": "ssl_certfile",
    "REDIS_TLS_KEY_FILE": "ssl_keyfile",
}
#: redis-py arguments that only a standalone server knows (a cluster has one database).
_NOT_FOR_CLUSTER = (
    "db",
    "health_check_interval",
    "connection_class",
    "redis_cls",
    "retry_on_timeout",
)


@dataclass(frozen=True)
class RedisTarget:
    """Which Redis (standalone, Sentinel or Cluster) and how to reach it."""

    mode: str  # "single", "sentinel" or "cluster"
    url: str = DEFAULT_URL  # single: the URL redis-py parses; otherwise the URL given, if any
    nodes: tuple[tuple[str, int], ...] = ()  # sentinel or cluster: where to ask first
    service: str = ""  # sentinel: the primary's name in the sentinels' configuration
    db: int = 0
    tls: bool = False
    username: str | None = None
    password: str | None = None
    params: dict[str, Any] = field(default_factory=dict)  # extra client arguments

    @property
    def display(self) -> str:
        """The address for logs and errors, password masked."""
        if self.mode == "single" or self.url.startswith(("redis+", "rediss+")):
            return mask_url(self.url)
        scheme = ("rediss+" if self.tls else "redis+") + self.mode
        where = ",".join(f"{h}:{p}" for h, p in self.nodes)
        tail = f"/{self.service}/{self.db}" if self.mode == "sentinel" else ""
        return f"{scheme}://{where}{tail}"


# -- from a URL or the settings ------------------------------------------------------------


def parse_url(url: str) -> RedisTarget:
    """A target from a URL of any supported scheme (ValueError names the URL, masked)."""
    scheme = url.partition("://")[0].lower()
    check_address(url, one_host=scheme in ("redis", "rediss"))
    check_query(url)
    if scheme in ("redis+sentinel", "rediss+sentinel"):
        return _sentinel_url(url, tls=scheme.startswith("rediss"))
    if scheme in ("redis+cluster", "rediss+cluster"):
        return _cluster_url(url, tls=scheme.startswith("rediss"))
    if scheme in ("redis", "rediss", "unix"):
        parts = urlsplit(url)
        database = unquote(parts.path).strip("/") if scheme != "unix" else ""
        if database and not database.isdigit() and "db=" not in parts.query:  # read as 0
            raise RedisConfigError(
                f"REDIS_URL {mask_url(url)!r}: its path is not a database number "
                f"(redis://host:6379/0)"
            )
        return RedisTarget("single", url=url, tls=scheme == "rediss")
    what = f"unknown scheme {scheme!r}" if "://" in url else "no scheme (no '://')"
    raise RedisConfigError(
        f"REDIS_URL {mask_url(url)!r}: {what}; use redis://, rediss://, "
        f"unix://, redis+sentinel:// or redis+cluster://"
    )


def _userinfo(url: str) -> tuple[str | None, str | None, str, str]:
    """(username, password, hosts part, path) of a URL whose netloc may list hosts."""
    parts = urlsplit(url)
    user: str | None = None
    password: str | None = None
    hosts = parts.netloc
    if "@" in hosts:
        info, hosts = hosts.rsplit("@", 1)
        name, colon, secret = info.partition(":")
        user = unquote(name) or None
        password = unquote(secret) if colon else None
    return user, password, hosts, parts.path


def _sentinel_url(url: str, *, tls: bool) -> RedisTarget:
    user, password, hosts, path = _userinfo(url)
    service, _, db = path.strip("/").partition("/")
    if not service or (db and not db.isdigit()):
        raise RedisConfigError(
            f"REDIS_URL {mask_url(url)!r}: a Sentinel URL is "
            f"redis+sentinel://[:password@]host:port[,host:port]/<service>[/<db>]"
        )
    nodes = parse_nodes(hosts, SENTINEL_PORT, f"REDIS_URL {mask_url(url)!r}")
    return RedisTarget("sentinel", url, nodes, service, int(db or 0), tls, user, password)


def _cluster_url(url: str, *, tls: bool) -> RedisTarget:
    user, password, hosts, path = _userinfo(url)
    if path.strip("/") not in ("", "0"):
        raise RedisConfigError(
            f"REDIS_URL {mask_url(url)!r}: a Redis Cluster has database 0 only; "
            f"drop {path!r} from the URL"
        )
    nodes = parse_nodes(hosts, REDIS_PORT, f"REDIS_URL {mask_url(url)!r}")
    return RedisTarget("cluster", url, nodes, tls=tls, username=user, password=password)


def target_from_settings(settings: BaseSettings) -> RedisTarget:
    """The Redis these settings name (see the module's documentation for the order)."""
    params = redis_params(settings)
    target = _base_target(settings, params)
    if target.mode == "single" and _names_cluster(params.get("redis_cls")):
        target = _single_as_cluster(target)
    tls = _tls_params(settings, target)
    if target.tls:  # (what redis-py loads at each connection: see check_client_tls)
        check_client_tls(tls, params, target.url, target.display)
    if target.mode == "sentinel" and settings.get("REDIS_SENTINEL_PASSWORD"):
        params["sentinel_password"] = settings.get("REDIS_SENTINEL_PASSWORD")
    params.pop("url", None)
    return _with(target, {**params, **tls})


def uses_cluster(settings: BaseSettings) -> bool:
    """Does the client built from these settings talk to a Redis Cluster?

    Yes with ``REDIS_CLUSTER_NODES``, a ``redis+cluster://`` URL, or scrapy-redis's way:
    ``REDIS_PARAMS["redis_cls"]`` naming a ``RedisCluster`` class (or its dotted path).
    """
    try:
        return target_from_settings(settings).mode == "cluster"
    except ValueError:  # refused when the client is built, with its own message
        return False


def _base_target(settings: BaseSettings, params: dict[str, Any]) -> RedisTarget:
    if settings.get("REDIS_SENTINELS"):
        service = settings.get("REDIS_SENTINEL_SERVICE")
        if not service:
            raise RedisConfigError(
                "REDIS_SENTINELS is set but REDIS_SENTINEL_SERVICE is not: name the primary "
                "as the sentinels know it (their `sentinel monitor <name> ...` line)"
            )
        nodes = parse_nodes(settings.get("REDIS_SENTINELS"), SENTINEL_PORT, "REDIS_SENTINELS")
        db = whole_setting(settings, "REDIS_DB")
        return RedisTarget("sentinel", "", nodes, str(service), db, _tls_wanted(settings))
    if settings.get("REDIS_CLUSTER_NODES"):
        nodes = parse_nodes(settings.get("REDIS_CLUSTER_NODES"), REDIS_PORT, "REDIS_CLUSTER_NODES")
        return RedisTarget("cluster", "", nodes, tls=_tls_wanted(settings))
    url = settings.get("REDIS_URL") or params.get("url")
    if url:
        return parse_url(str(url))
    return RedisTarget("single", url=settings_url(settings))


def _tls_wanted(settings: BaseSettings) -> bool:
    return any(settings.get(name) for name in TLS_SETTINGS)


def _single_as_cluster(target: RedisTarget) -> RedisTarget:
    """scrapy-redis's way: a ``redis://`` URL of one node and a ``RedisCluster`` class."""
    parts = urlsplit(target.url)
    node = ((parts.hostname or "localhost", parts.port or REDIS_PORT),)
    user, password = parts.username, parts.password
    return RedisTarget(
        "cluster", target.url, node, tls=target.tls, username=user, password=password
    )


def _names_cluster(cls: Any) -> bool:
    if isinstance(cls, type):
        clusters = (redis.RedisCluster, redis.asyncio.RedisCluster)
        return issubclass(cls, clusters) or "Cluster" in cls.__name__
    return isinstance(cls, str) and "Cluster" in cls.rpartition(".")[2]


def _tls_params(settings: BaseSettings, target: RedisTarget) -> dict[str, Any]:
    given = {arg: settings.get(name) for name, arg in TLS_SETTINGS.items() if settings.get(name)}
    if given and not target.tls:
        names = ", ".join(n for n, a in TLS_SETTINGS.items() if a in given)
        raise RedisConfigError(
            f"{names} set, but Redis at {target.display} is not reached over TLS: use a "
            f"rediss:// URL (rediss+sentinel://, rediss+cluster://), or drop {names}"
        )
    for name, arg in TLS_SETTINGS.items():  # read at each connection: missing, it would be
        path = given.get(arg)  # taken for a Redis that does not answer, again and again
        if path and not os.path.isfile(path):
            raise RedisConfigError(f"{name}={path!r}: no such file (for Redis at {target.display})")
    return given


def _with(target: RedisTarget, params: dict[str, Any]) -> RedisTarget:
    return RedisTarget(
        target.mode,
        target.url,
        target.nodes,
        target.service,
        target.db,
        target.tls,
        target.username,
        target.password,
        params,
    )


# -- clients -------------------------------------------------------------------------------


def async_client(settings: BaseSettings, *, connect_timeout: float, **overrides: Any) -> Any:
    """An asyncio client of the Redis the settings name (create it on the running loop);
    *overrides* are redis-py client arguments that win over ``REDIS_PARAMS`` (a metrics
    scrape's short ``socket_timeout``, say)."""
    target = target_from_settings(settings)
    params = _defaults(connect_timeout) | target.params | overrides
    with refused_arguments():
        if target.mode == "sentinel":
            return _sentinel_client(target, params, redis.asyncio.sentinel.Sentinel, _AsyncPrimary)
        if target.mode == "cluster":
            return _cluster_client(target, params, redis.asyncio.RedisCluster, _async_cluster)
        cls = own_class(params.pop("redis_cls", None), redis.asyncio.Redis)
        return cls.from_url(target.url, **params)


def sync_client(settings: BaseSettings, *, connect_timeout: float, **overrides: Any) -> Any:
    """A blocking client of the same Redis (for a thread, or a synchronous tool)."""
    target = target_from_settings(settings)
    params = _defaults(connect_timeout) | target.params | overrides
    with refused_arguments():
        if target.mode == "sentinel":
            return _sentinel_client(target, params, redis.sentinel.Sentinel, _SyncPrimary)
        if target.mode == "cluster":
            return _cluster_client(target, params, redis.RedisCluster, blocking_cluster)
        cls = own_class(params.pop("redis_cls", None), redis.Redis)
        return cls.from_url(target.url, **params)


def _defaults(connect_timeout: float) -> dict[str, Any]:
    return {
        "socket_connect_timeout": connect_timeout,
        "socket_timeout": DEFAULT_SOCKET_TIMEOUT,
        "retry_on_timeout": False,
        "health_check_interval": HEALTH_CHECK_INTERVAL,
    }


def _auth(target: RedisTarget) -> dict[str, Any]:
    auth: dict[str, Any] = {}
    if target.username:
        auth["username"] = target.username
    if target.password is not None:
        auth["password"] = target.password
    return auth


def _async_cluster(cls: Any, nodes: tuple[tuple[str, int], ...], kwargs: dict[str, Any]) -> Any:
    return cls(startup_nodes=[redis.asyncio.cluster.ClusterNode(*n) for n in nodes], **kwargs)


def _cluster_client(target: RedisTarget, params: dict[str, Any], cls: Any, make: Any) -> Any:
    """A cluster client of *cls*, made by *make* from the startup nodes and the client's
    arguments (the blocking client's of nodes that answer: see .answering)."""
    kwargs = {k: v for k, v in params.items() if k not in _NOT_FOR_CLUSTER}
    kwargs.update(_auth(target))
    if target.tls:
        kwargs["ssl"] = True
    return ask_answering_nodes(follow_asks(make(cls, target.nodes, kwargs)))


#: redis-py arguments of how a certificate is checked: given in REDIS_PARAMS for the
#: primary, they hold for the sentinels too (over TLS they present certificates as well).
_TLS_CHECKS = ("ssl_include_verify_flags", "ssl_exclude_verify_flags", "ssl_check_hostname")


def _sentinel_client(
    target: RedisTarget, params: dict[str, Any], sentinel_cls: Any, primary_cls: type
) -> Any:
    """The primary's client; the sentinels are asked for it on every new connection."""
    params = dict(params)
    params.pop("redis_cls", None)  # the primary's client is the sentinel-managed one
    tls = {arg: params[arg] for arg in (*TLS_SETTINGS.values(), *_TLS_CHECKS) if arg in params}
    wait = params["socket_connect_timeout"]  # shared by the sentinels and the primary: one
    wait = wait and wait / (len(target.nodes) + 1)  # that hangs leaves time for the next
    asking: dict[str, Any] = {"socket_connect_timeout": wait, "socket_timeout": wait, **tls}
    asking["retry"] = None  # redis-py 8 asked one that hangs 4 times, with backoff, not the next
    sentinel_password = params.pop("sentinel_password", None)
    if sentinel_password:
        asking["password"] = sentinel_password
    if target.tls:
        asking["ssl"] = params["ssl"] = True
    sentinels = sentinel_cls(list(target.nodes), sentinel_kwargs=asking)
    primary_kwargs = {**params, **_auth(target), "db": target.db}
    return sentinels.master_for(target.service, redis_class=primary_cls, **primary_kwargs)


class _AsyncPrimary(redis.asyncio.Redis):
    """The primary's asyncio client that also closes its connections to the sentinels."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):
            await sentinel.aclose()


class _SyncPrimary(redis.Redis):
    """The primary's blocking client that also closes its connections to the sentinels."""

    def close(self) -> None:
        super().close()
        manager = getattr(self.connection_pool, "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):
            sentinel.close()
