"""The shared cookie jars of a crawl as Redis holds them (``lua/lib/jars.lua``): how a cookie
is stored, merged and read back, for :mod:`scrapy_ha.middlewares.cookies`.

A change one worker merges never erases another worker's cookies: only the cookies it set or
dropped change. Cookie values are secrets: they live in the crawl's cookies key and nowhere else.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from dataclasses import dataclass, field
from http.cookiejar import Cookie
from typing import TYPE_CHECKING, Any

from scrapy_ha.store import scripts
from scrapy_ha.store.connection import REDIS_DOWN_ERRORS

if TYPE_CHECKING:
    from collections.abc import Hashable, Iterable

    from scrapy.http.cookies import CookieJar

    from scrapy_ha.keys import Keys

__all__ = [
    "BAD_JAR_PREFIX",
    "BadJar",
    "SharedJars",
    "cookie_from_dict",
    "cookie_id",
    "cookie_to_dict",
    "jar_field",
    "lift_failed_logins",
    "login_epoch",
    "snapshot",
    "snapshot_domains",
]

logger = logging.getLogger(__name__)


#: The attributes of ``http.cookiejar.Cookie``, in the order its constructor takes them.
COOKIE_FIELDS = (
    "version",
    "name",
    "value",
    "port",
    "port_specified",
    "domain",
    "domain_specified",
    "domain_initial_dot",
    "path",
    "path_specified",
    "secure",
    "expires",
    "discard",
    "comment",
    "comment_url",
    "rest",
    "rfc2109",
)

#: Prefix of the field a malformed jar is moved to (kept for a look, never read again).
BAD_JAR_PREFIX = "bad-"


class BadJar(ValueError):
    """A jar in Redis that is not a JSON object of cookies."""


def cookie_id(cookie: Cookie) -> str:
    """What identifies a cookie in a jar: domain, path and name (as in ``http.cookiejar``)."""
    return f"{cookie.domain}\t{cookie.path}\t{cookie.name}"


def cookie_to_dict(cookie: Cookie) -> dict[str, Any]:
    data = {name: getattr(cookie, name) for name in COOKIE_FIELDS if name != "rest"}
    data["rest"] = dict(cookie._rest)  # type: ignore[attr-defined]
    return data


def cookie_from_dict(data: dict[str, Any]) -> Cookie:
    values: dict[str, Any] = {name: data.get(name) for name in COOKIE_FIELDS}
    values["rest"] = dict(values["rest"] or {})
    return Cookie(**values)


def snapshot(jar: CookieJar) -> dict[str, dict[str, Any]]:
    """Every cookie of *jar* by id, as JSON-ready dicts."""
    return {cookie_id(c): cookie_to_dict(c) for c in jar.jar}


def snapshot_domains(jar: CookieJar, domains: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The cookies of *jar* whose domain is one of *domains*, by id, as JSON-ready dicts:
    what one response can change, read without going through the whole jar."""
    by_domain: dict[str, dict[str, dict[str, Cookie]]] = getattr(jar.jar, "_cookies", {})
    return {
        cookie_id(c): cookie_to_dict(c)
        for domain in domains
        for names in by_domain.get(domain, {}).values()
        for c in names.values()
    }


def jar_field(key: Hashable) -> str:
    """The field of a jar in the cookies hash: its ``cookiejar`` meta key, JSON-encoded
    (the default jar is ``null``; ``1`` and ``"1"`` stay two jars, as in Scrapy)."""
    try:
        return json.dumps(key, sort_keys=True)
    except TypeError:
        return json.dumps(repr(key))


@dataclass
class SharedJars:
    """The jars of one worker and their versions, kept in step with Redis."""

    client: Any
    keys: Keys
    stats: Any = None
    #: how long the jars live in Redis unused (ms; 0: for ever): see HA_COOKIES_TTL
    ttl_ms: int = 0
    versions: dict[str, int] = field(default_factory=dict)
    #: the login epoch of the session each copy holds, as of its version (only those above 0:
    #: a crawl that never used ``login_once`` stamps nothing)
    epochs: dict[str, int] = field(default_factory=dict)
    #: the epoch of the login request this worker has in flight, per jar (login_once)
    logging_in: dict[str, int] = field(default_factory=dict)
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    merge: Any = None
    set_aside: Any = None
    login: Any = None
    #: when this worker last set the jars' TTL (monotonic seconds)
    refreshed: float = -math.inf
    _refreshing: asyncio.Task[None] | None = None

    def lock(self, key: Hashable) -> asyncio.Lock:
        return self.locks.setdefault(jar_field(key), asyncio.Lock())

    def version(self, key: Hashable) -> int:
        return self.versions.get(jar_field(key), 0)

    async def store(
        self, key: Hashable, changed: dict[str, Any], dropped: list[str], epoch: int = 0
    ) -> int:
        """Merge a change of this worker into Redis, made by the answer to a request sent with
        the session of login *epoch*; return the jar's new version (0: the change changed
        nothing there, and its version stays; -1: a newer login is done, the change is
        refused)."""
        if self.merge is None:
            self.merge = self.client.register_script(scripts.JAR_MERGE_LUA)
        name = jar_field(key)
        args = [f"jar:{name}", f"v:{name}", json.dumps(changed), json.dumps(dropped), self.ttl_ms]
        args += [f"login:{name}", epoch]
        version = int(await self.merge(keys=[self.keys.cookies], args=args))
        self.refreshed = time.monotonic()
        self.count("ha/cookies/stored")
        return version

    def refresh(self) -> None:
        """This worker uses the jars: set their TTL again once a quarter of it has passed
        (in the background: the request never waits for it), so that jars in use never
        expire while every worker has them in memory and none changes them."""
        now = time.monotonic()
        if not self.ttl_ms or now - self.refreshed < self.ttl_ms / 4000:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a test without a crawl): nothing to refresh
            return
        self.refreshed = now
        self._refreshing = loop.create_task(self._refresh())

    async def _refresh(self) -> None:
        try:
            await self.client.pexpire(self.keys.cookies, self.ttl_ms)
        except REDIS_DOWN_ERRORS as exc:
            self.refreshed = -math.inf  # the next request tries again
            logger.debug("Could not refresh the TTL of %s (%s)", self.keys.cookies, exc)

    async def load(self, key: Hashable) -> tuple[list[Cookie], int]:
        """The jar as Redis has it, and its version (and, in :attr:`epochs`, the login epoch
        of its session, read with it)."""
        name = jar_field(key)
        fields = [f"jar:{name}", f"v:{name}", f"login:{name}"]
        raw, version, login = await self.client.hmget(self.keys.cookies, fields)
        epoch = login_epoch(login)
        if epoch:
            self.epochs[name] = epoch
        else:
            self.epochs.pop(name, None)
        try:
            cookies = _parse_jar(raw) if raw else []
        except BadJar as exc:
            await self._set_aside(name, raw, exc)
            cookies = []
        self.count("ha/cookies/loaded")
        return cookies, int(version or 0)

    async def login_step(self, key: Hashable, step: str, epoch: int, timeout_ms: int = 0) -> Any:
        """``lua/jar_login.lua``: *step* ``claim`` (a request sent with the session of login
        *epoch* met its expiry), ``done`` (the answer to login *epoch* came) or ``failed``
        (it came and failed the spider's check: no login for *timeout_ms*); returns the
        script's ``[action, epoch, version]`` (and the ms left of a failed login's pause)."""
        if self.login is None:
            self.login = self.client.register_script(scripts.JAR_LOGIN_LUA)
        name = jar_field(key)
        args = [step, f"login:{name}", f"v:{name}", epoch, timeout_ms, self.ttl_ms]
        return [int(x) for x in await self.login(keys=[self.keys.cookies], args=args)]

    async def _set_aside(self, name: str, raw: bytes, exc: BadJar) -> None:
        """One bad jar costs that jar alone: move it aside, go on with an empty one."""
        if self.set_aside is None:
            self.set_aside = self.client.register_script(scripts.JAR_SET_ASIDE_LUA)
        field_name = f"jar:{name}"
        moved = await self.set_aside(keys=[self.keys.cookies], args=[field_name, raw])
        if moved:
            self.count("ha/cookies/bad_jar")
            logger.error(
                "The shared cookie jar %s in %s is malformed (%s): moved it to the field %s "
                "and started this jar from empty; the next login fills it again",
                name,
                self.keys.cookies,
                exc,
                BAD_JAR_PREFIX + field_name,
            )

    def count(self, stat: str) -> None:
        if self.stats is not None:
            self.stats.inc_value(stat)


async def lift_failed_logins(client: Any, keys: Keys) -> int:
    """Lift the hold of every jar's failed login (``lua/jar_lift.lua``): the next page that
    meets the form logs in. ``scrapy-ha dlq requeue`` does, once the credentials were
    mended: the pages requeued must not meet a hold set by the old ones. Returns how many
    it lifted."""
    fields = [f async for f, _ in client.hscan_iter(keys.cookies, match="login:*")]
    if not fields:
        return 0
    lift = client.register_script(scripts.JAR_LIFT_LUA)
    return int(await lift(keys=[keys.cookies], args=fields))


def login_epoch(stored: bytes | str | None) -> int:
    """The epoch of the session a jar holds, from its login field (``lua/jar_login.lua``):
    the epoch of a login done, the one before it while a login is in flight or once it
    failed; 0 when none."""
    if not stored:
        return 0
    text = stored.decode() if isinstance(stored, bytes) else stored
    parts = text.split(" ")
    if len(parts) != 3 or not parts[0].isdigit():
        return 0
    return int(parts[0]) if parts[1] == "done" else int(parts[0]) - 1


def _expired(cookie: dict[str, Any], now: float) -> bool:
    expires = cookie.get("expires")
    return isinstance(expires, (int, float)) and expires <= now


def _parse_jar(raw: bytes | str) -> list[Cookie]:
    """The cookies of a stored jar; :class:`BadJar` says what is wrong with it."""
    try:
        stored = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadJar(f"not JSON: {exc}") from None
    if not isinstance(stored, dict) or not all(isinstance(c, dict) for c in stored.values()):
        raise BadJar("not a JSON object of cookie objects")
    now = time.time()
    try:
        return [cookie_from_dict(c) for c in stored.values() if not _expired(c, now)]
    except (TypeError, ValueError, AttributeError) as exc:
        raise BadJar(f"a cookie cannot be rebuilt: {exc}") from None
