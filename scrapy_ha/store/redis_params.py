"""``REDIS_PARAMS`` and ``REDIS_ENCODING`` as scrapy-redis reads them, checked before a
client is made: a value redis-py cannot use failed at the first command, with a traceback
(a text for a timeout, an encoding Python does not have), or was blamed on REDIS_URL."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy_ha.config.validate import ConfigError

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = ["SCRAPY_REDIS_ENCODING", "TIMEOUT_PARAMS", "RedisConfigError", "redis_params"]

#: scrapy-redis's own defaults for ``REDIS_PARAMS``, honoured here.
SCRAPY_REDIS_ENCODING = "utf-8"
#: The arguments of ``REDIS_PARAMS`` that are seconds.
TIMEOUT_PARAMS = ("socket_timeout", "socket_connect_timeout", "health_check_interval")


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
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise RedisConfigError(f"REDIS_PARAMS[{name!r}]={value!r} must be seconds")
    return params


def _text_encoding(name: str, encoding: Any) -> None:
    """*encoding* is one redis-py can encode text with (``base64`` is a codec, not one)."""
    try:
        "".encode(encoding)
        b"".decode(encoding)
    except (LookupError, TypeError):
        raise RedisConfigError(f"{name}={encoding!r} is not a text encoding") from None
