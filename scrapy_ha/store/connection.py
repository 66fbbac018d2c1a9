"""The Redis clients of scrapy-ha, built from the connection settings in one place.

``REDIS_URL``, ``REDIS_HOST``, ``REDIS_PORT``, ``REDIS_DB``, ``REDIS_ENCODING`` and
``REDIS_PARAMS`` keep the meaning they have in scrapy-redis; :mod:`scrapy_ha.store.url`
adds TLS, Unix sockets, Sentinel and Cluster, and builds every client. A connection that
finds a read-only replica where the primary was (a failover) is dropped and reported as
a connection error, so the caller's reconnect-with-backoff follows the new primary.
"""

from __future__ import annotations

import asyncio
import codecs
import functools
import random
import ssl
import sys
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio
from redis.utils import HIREDIS_AVAILABLE

from scrapy_ha.codec import mask_url
from scrapy_ha.store import url as _redis_url
from scrapy_ha.store.auth_hint import refused_login
from scrapy_ha.store.health import info_or_nothing
from scrapy_ha.store.redis_params import ARGUMENTS
from scrapy_ha.store.tls_hint import tls_hint
from scrapy_ha.store.url import DEFAULT_SOCKET_TIMEOUT, RedisConfigError

if HIREDIS_AVAILABLE:
    import hiredis

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

__all__ = [
    "DEFAULT_SOCKET_TIMEOUT",
    "REDIS_DOWN_ERRORS",
    "RedisConfigError",
    "RedisDown",
    "RedisUnavailable",
    "display_url",
    "error_text",
    "jittered",
    "redis_from_settings",
    "start_error",
    "sync_redis_from_settings",
    "untrusted_certificate",
]

#: Errors that mean "Redis is unreachable right now": retried with backoff. A cluster
#: that is re-electing a primary (CLUSTERDOWN, MASTERDOWN, TRYAGAIN) is unreachable too.
REDIS_DOWN_ERRORS = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterError,
    redis.exceptions.RedisClusterException,  # no node reachable, or a slot not served yet
    ConnectionError,
    OSError,
    asyncio.TimeoutError,
)

#: The error Redis answers a write with while ``min-replicas-to-write`` is not met.
NO_REPLICAS = "NOREPLICAS"
#: Whether the worker's connections write under ``asyncio.timeout`` (:class:`_AsyncTimedWrites`).
TIMED_WRITES = (3, 11, 3) <= sys.version_info[:3] < (3, 12, 0)


class RedisUnavailable(RuntimeError):
    """Redis cannot be reached; the message names the URL (password masked)."""


class RedisDown(RedisUnavailable):
    """Redis did not answer (refused, timed out, loading, a cluster electing a primary):
    worth trying again, unlike credentials it refused. *reason*: the error, masked."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def redis_from_settings(settings: BaseSettings, *, connect_timeout: float, **overrides: Any) -> Any:
    """Return an asyncio Redis client (create it on the running event loop); *overrides*
    are redis-py client arguments that win over ``REDIS_PARAMS``."""
    client = _redis_url.async_client(settings, connect_timeout=connect_timeout, **overrides)
    _mix_in(client, _AsyncFailoverAware)
    _mix_in(client, _AsyncCheckedByHandshake)
    if TIMED_WRITES:
        _mix_in(client, _AsyncTimedWrites)
    if HIREDIS_AVAILABLE:
        _mix_in(client, _AsyncHiredisPacking)
    return client


def sync_redis_from_settings(
    settings: BaseSettings, *, connect_timeout: float, **overrides: Any
) -> Any:
    """A blocking Redis client of the same Redis (for a thread, or synchronous tools such
    as a metrics exporter); *overrides* as for :func:`redis_from_settings`."""
    client = _redis_url.sync_client(settings, connect_timeout=connect_timeout, **overrides)
    _mix_in(client, _SyncFailoverAware)
    return client


def jittered(delay: float) -> float:
    """A wait between half *delay* and *delay* ("equal jitter"): the backoff still grows,
    and workers that lost Redis at the same instant do not all come back at once."""
    return random.uniform(delay / 2, delay)


def error_text(exc: BaseException) -> str:
    """An error for a log line: its type and its message (``TimeoutError: Timeout reading
    from ...``); the type alone when it has no message (an asyncio timeout has none)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def start_error(exc: BaseException, url: str) -> str:
    """Why a worker cannot start, as its one ERROR line: Redis's own answer names no address
    (``DB index is out of range``, a protocol error from a port that is no Redis's), so
    the URL (masked) goes with it; a RedisUnavailable names it already."""
    if isinstance(exc, RedisUnavailable):
        return str(exc)
    said = f"scrapy-ha cannot start: Redis at {url} answered {error_text(exc)}"
    if "DB index is out of range" in str(exc):  # (a QA run: REDIS_DB=99 named no setting)
        said += ": give a database it has (CONFIG GET databases: 16 by default, 0 to 15)"
        said += " in REDIS_DB, or as the path of REDIS_URL"
    return said


def display_url(settings: BaseSettings) -> str:
    """The Redis address for logs and errors, password masked."""
    try:
        return _redis_url.target_from_settings(settings).display
    except (RedisConfigError, ValueError, TypeError):
        return mask_url(str(settings.get("REDIS_URL") or _redis_url.DEFAULT_URL))


def _mix_in(client: Any, mixin: type) -> None:
    """Make the client's connections of a class with *mixin* first (a cluster client's
    are left as they are).

    :class:`_AsyncFailoverAware` (and ``_SyncFailoverAware``) make them take a failover for
    Redis being away: a READONLY reply (the connection reaches a primary demoted to a
    replica) closes the connection: a plain URL whose name moves to the new primary (a
    managed service's failover) is resolved again by the next one, a Sentinel client asks
    the sentinels (redis-py does that itself), a cluster client follows MOVED replies
    instead. A NOREPLICAS reply (``min-replicas-to-write`` not met: the primary lost its
    replicas) is waited out the same way: it is not bad data. :class:`_AsyncHiredisPacking`
    packs their commands with hiredis."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return
    base = pool.connection_class
    if not issubclass(base, mixin):
        name = mixin.__name__.removeprefix("_Async").removeprefix("_Sync")
        pool.connection_class = type(f"{name}{base.__name__}", (mixin, base), {})


@functools.cache
def _hiredis_writes(encoding: str, errors: str) -> bool:
    """Whether hiredis writes a str as redis-py's encoder would: UTF-8, strict."""
    return errors == "strict" and codecs.lookup(encoding).name == "utf-8"


class _AsyncHiredisPacking:
    """A connection that packs commands with hiredis, as redis-py's blocking client does
    whenever hiredis is installed (its asyncio client packs in Python: a sync call of 60
    arguments took 46 µs to pack there, 5 µs with hiredis). The same bytes for every type
    redis-py's encoder takes; a str is written as UTF-8, as that blocking client writes it
    (another ``REDIS_ENCODING``, or ``encoding_errors`` other than ``strict``, keeps
    redis-py's packing)."""

    encoder: Any

    def pack_command(self, *args: Any) -> list[bytes]:
        if not _hiredis_writes(self.encoder.encoding, self.encoder.encoding_errors):
            return super().pack_command(*args)  # type: ignore[misc,no-any-return]
        if isinstance(args[0], str):  # a command name of several words: 'FUNCTION LOAD'
            args = (*args[0].encode().split(), *args[1:])
        elif b" " in args[0]:
            args = (*args[0].split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError:
            pass
        args = tuple(bytes(a) if isinstance(a, bytearray) else a for a in args)
        try:
            return [hiredis.pack_command(args)]
        except TypeError as exc:  # a bool, None, another object: as redis-py's encoder says
            raise redis.exceptions.DataError(f"{exc} (a command's argument)") from exc


class _AsyncCheckedByHandshake:
    """A connection just made is not PINGed before its handshake.

    With ``health_check_interval`` set (the worker sets 30 s), redis-py PINGs a connection
    before a command once the interval has passed since its last reply, and a new
    connection has had none: every connection the worker opened without credentials (at
    start, and after each reconnection) sent a PING, one round trip, before its ``HELLO``
    (with credentials, redis-py sends ``AUTH`` or ``HELLO ... AUTH`` unchecked). The
    handshake's reply (or, without one, the first command's) tells as much; a connection
    that sat idle for the interval is still PINGed before use."""

    health_check_interval: float
    next_health_check: float

    async def _connect(self) -> None:
        await super()._connect()  # type: ignore[misc]
        if self.health_check_interval:
            self.next_health_check = asyncio.get_running_loop().time() + self.health_check_interval


class _AsyncFailoverAware:
    """A connection that raises ConnectionError on READONLY (closing itself first) and on
    NOREPLICAS."""

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)  # type: ignore[misc]
        except redis.exceptions.ReadOnlyError as exc:
            await self.disconnect()  # type: ignore[attr-defined]
            raise redis.exceptions.ConnectionError(_readonly_text(exc)) from exc
        except redis.exceptions.ResponseError as exc:
            if str(exc).startswith(NO_REPLICAS):
                raise redis.exceptions.ConnectionError(_noreplicas_text(exc)) from exc
            raise


class _AsyncTimedWrites:
    """A connection that bounds a write by ``socket_timeout`` with ``asyncio.timeout``.

    redis-py's asyncio client writes a command under ``asyncio.wait_for``, which on Python
    3.11 wraps the write in a task of its own: a task made, scheduled and awaited, and a
    timer, two more turns of the event loop per command, for a write that nearly always
    ends at once (the socket takes it: ``drain`` then returns without waiting). Here a
    connected connection runs the same steps (its health check, then the write), with the
    same errors, without the task; anything else goes to redis-py's own path. Mixed in on
    Python 3.11.3 to 3.11.x only (:data:`TIMED_WRITES`): from 3.12 ``wait_for`` makes no
    task, and before 3.11.3 ``asyncio.timeout`` could give a cancelled task's timeout as
    a cancellation (CPython gh-102780), which redis-py itself avoids there."""

    socket_timeout: float | None

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        timeout = self.socket_timeout
        if not timeout or not isinstance(command, list) or not self.is_connected:  # type: ignore[attr-defined]
            return await super().send_packed_command(command, check_health)  # type: ignore[misc,no-any-return]
        if check_health:
            await self.check_health()  # type: ignore[attr-defined]
        try:
            async with asyncio.timeout(timeout):
                await self._send_packed_command(command)  # type: ignore[attr-defined]
        except TimeoutError:
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            raise redis.exceptions.TimeoutError("Timeout writing to socket") from None
        except OSError as exc:
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            number, text = ("UNKNOWN", exc.args[0]) if len(exc.args) == 1 else exc.args[:2]
            raise redis.exceptions.ConnectionError(
                f"Error {number} while writing to socket. {text}."
            ) from exc
        except BaseException:  # cancelled half-way: what was sent of it is unknown
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            raise


class _SyncFailoverAware:
    """The same for the blocking client."""

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)  # type: ignore[misc]
        except redis.exceptions.ReadOnlyError as exc:
            self.disconnect()  # type: ignore[attr-defined]
            raise redis.exceptions.ConnectionError(_readonly_text(exc)) from exc
        except redis.exceptions.ResponseError as exc:
            if str(exc).startswith(NO_REPLICAS):
                raise redis.exceptions.ConnectionError(_noreplicas_text(exc)) from exc
            raise


def _noreplicas_text(exc: Exception) -> str:
    return (
        f"the primary refuses writes while too few replicas follow it ({exc}: "
        f"min-replicas-to-write); waiting for a replica"
    )


def _readonly_text(exc: Exception) -> str:
    return (
        f"the server is a read-only replica now ({exc}): the primary failed over; "
        f"reconnecting until REDIS_URL reaches a primary"
    )


async def check_reachable(client: Any, url: str, timeout: float) -> dict[str, Any]:
    """Redis's ``INFO`` (its version, and what :mod:`.health` checks) within *timeout*, in
    one round trip; raise RedisUnavailable (RedisDown while it may come back)."""
    try:
        async with asyncio.timeout(timeout):
            info = await info_or_nothing(client)
    except redis.exceptions.AuthenticationError as exc:
        fix = "give the user name and password in REDIS_URL (or REDIS_PARAMS)"
        raise RedisUnavailable(f"{refused_login(url, str(exc))}: {fix}") from None
    except TypeError as exc:  # an argument redis-py does not take, met at the first connection
        raise RedisConfigError(f"{ARGUMENTS}: redis-py refused an argument ({exc})") from None
    except REDIS_DOWN_ERRORS as exc:
        untrusted = untrusted_certificate(exc, url, "REDIS_TLS_CA_FILE")
        if untrusted:  # waiting does not mend it: fail at once
            raise RedisUnavailable(untrusted) from None
        reason = down_reason(exc, url)
        raise RedisDown(
            f"scrapy-ha cannot reach Redis at {url} within {timeout:g} s ({reason}). {CHECK_REDIS}",
            reason,
        ) from None
    return info


def server_version(info: dict[str, Any]) -> str:
    """The version ``INFO`` gives (``"?"`` for a cluster's, one per node)."""
    return str(info.get("redis_version", "?"))


#: What to check when Redis cannot be reached.
CHECK_REDIS = (
    "Check REDIS_URL and that redis-server (or the sentinels, or the cluster nodes, it "
    "names) is running and reachable from this worker."
)


#: OpenSSL's verification errors (``x509_vfy.h``) that waiting does not mend: no CA the
#: client knows signed the server's certificate (2, 18 to 21) ...
_UNKNOWN_ISSUER = frozenset({2, 18, 19, 20, 21})
#: ... the certificate is for another host than the one named (62, 64) ...
_OTHER_HOST = frozenset({62, 64})
#: ... and what only strict verification (``VERIFY_X509_STRICT``, Python 3.13's default)
#: reports: extensions a CA or a server's certificate lacks (78, 80 to 94; not 79, which
#: OpenSSL reports without it too). An expired certificate, or one not valid yet (a clock
#: behind), can be mended while the worker waits: those are tried again, as before.
_STRICT_ONLY = frozenset({78, *range(80, 95)})


def untrusted_certificate(exc: BaseException, url: str, ca_setting: str) -> str | None:
    """If *exc* (redis-py wraps the SSL error it met) is a server certificate this client
    refuses for a reason that waiting does not mend, a sentence that says so and what to
    check (*ca_setting* names the CA file); None for any other error."""
    cause: BaseException | None = exc
    for _ in range(8):  # redis-py's errors, raised while handling the SSL error
        if cause is None or isinstance(cause, ssl.SSLCertVerificationError):
            break
        cause = cause.__cause__ or cause.__context__
    if not isinstance(cause, ssl.SSLCertVerificationError):
        return None
    code = cause.verify_code
    if code in _UNKNOWN_ISSUER:
        advice = f"check that {ca_setting} names the CA that signed the server's certificate"
    elif code in _OTHER_HOST:
        advice = (
            "the certificate is not for the host the URL names: reach Redis by a name or "
            "address its certificate lists (subjectAltName)"
        )
    elif code in _STRICT_ONLY:
        advice = (
            "Python 3.13 and later verify strictly (ssl.VERIFY_X509_STRICT), and a certificate "
            "of the chain lacks what that asks for: reissue it, or relax the check for this "
            "Redis alone (redis-py 7 and later) with REDIS_PARAMS = "
            '{"ssl_exclude_verify_flags": [ssl.VERIFY_X509_STRICT]}'
        )
    else:
        return None
    why = (cause.verify_message or str(cause)).rstrip(".")
    return f"Redis at {url} presented a certificate this client does not accept ({why}): {advice}"


def down_reason(exc: BaseException, url: str) -> str:
    """``ConnectionError: Error 111 connecting to ...``, the password of *url* masked."""
    return f"{type(exc).__name__}: {_mask_in(exc, url)}{tls_hint(exc, url)}"


def _mask_in(exc: BaseException, url: str) -> str:
    text = str(exc) or "timed out"  # a script's error ends "on @user_script:1.": no user
    plain = text.replace("@user_script:", "").replace("@user_function:", "")
    return text if "@" not in plain else f"error connecting to {url}"


async def server_ms(client: Any) -> int:
    """Redis's clock in ms (every stored time is Redis time)."""
    return time_ms(await client.time())


def time_ms(reply: Any) -> int:
    """Milliseconds of a ``TIME`` reply (seconds, microseconds), as read in a pipeline."""
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000
