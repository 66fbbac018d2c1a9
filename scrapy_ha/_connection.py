"""The asyncio Redis client, built from scrapy-redis's connection settings.

``REDIS_URL``, ``REDIS_HOST``, ``REDIS_PORT``, ``REDIS_DB``, ``REDIS_ENCODING``
and ``REDIS_PARAMS`` keep the meaning they have in scrapy-redis: the settings
go through ``scrapy_redis.connection.get_redis_from_settings`` with an asyncio
client class in place of the blocking one.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio
from scrapy.settings import Settings
from scrapy.utils.misc import load_object
from scrapy_redis.connection import SETTINGS_PARAMS_MAP, get_redis_from_settings

from scrapy_ha.codec import mask_url

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

#: Read timeout of one Redis call: a script over a big batch finishes well within it.
DEFAULT_SOCKET_TIMEOUT = 15.0

#: Errors that mean "Redis is unreachable right now": retried with backoff.
REDIS_DOWN_ERRORS = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,
    ConnectionError,
    OSError,
    asyncio.TimeoutError,
)


class RedisUnavailable(RuntimeError):
    """Redis cannot be reached; the message names the URL (password masked)."""


def redis_from_settings(settings: BaseSettings, *, connect_timeout: float) -> Any:
    """Return an asyncio Redis client (create it on the running event loop)."""
    params: dict[str, Any] = {
        "socket_connect_timeout": connect_timeout,
        "socket_timeout": DEFAULT_SOCKET_TIMEOUT,
        "retry_on_timeout": False,
        "health_check_interval": 30,
    }
    params.update(settings.getdict("REDIS_PARAMS"))
    params["redis_cls"] = _async_class(params.get("redis_cls"))
    only_redis = Settings({name: settings.get(name) for name in SETTINGS_PARAMS_MAP})
    only_redis.set("REDIS_PARAMS", params)
    return get_redis_from_settings(only_redis)


def _async_class(cls: Any) -> type:
    if isinstance(cls, str):
        cls = load_object(cls)
    if isinstance(cls, type) and issubclass(cls, (redis.asyncio.Redis, redis.asyncio.RedisCluster)):
        return cls
    if isinstance(cls, type) and "Cluster" in cls.__name__:
        return redis.asyncio.RedisCluster
    return redis.asyncio.Redis


def display_url(settings: BaseSettings) -> str:
    """The Redis address for logs and errors, password masked."""
    url = settings.get("REDIS_URL") or settings.getdict("REDIS_PARAMS").get("url")
    if url:
        return mask_url(str(url))
    host = settings.get("REDIS_HOST") or "localhost"
    port = settings.get("REDIS_PORT") or 6379
    db = settings.get("REDIS_DB") or 0
    return f"redis://{host}:{port}/{db}"


async def check_reachable(client: Any, url: str, timeout: float) -> str:
    """PING Redis within *timeout*; return the server version or raise RedisUnavailable."""
    try:
        async with asyncio.timeout(timeout):
            await client.ping()
            info = await client.info("server")
    except redis.exceptions.AuthenticationError as exc:
        raise RedisUnavailable(
            f"Redis at {url} refused the credentials ({exc}): check the password in REDIS_URL"
        ) from None
    except REDIS_DOWN_ERRORS as exc:
        raise RedisUnavailable(
            f"scrapy-ha cannot reach Redis at {url} within {timeout:g} s "
            f"({type(exc).__name__}: {_mask_in(exc, url)}). Check REDIS_URL and that "
            f"redis-server is running and reachable from this worker."
        ) from None
    return str(info.get("redis_version", "?"))


def _mask_in(exc: BaseException, url: str) -> str:
    text = str(exc) or "timed out"
    return text if "@" not in text else f"error connecting to {url}"
