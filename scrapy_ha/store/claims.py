"""The crawl's dupefilter kind, claimed by its first worker (``ha:{S}:filter``): the checks
at start read what is stored, and a crawl is empty until a worker's first round, so two
workers of different kinds (or of different ``HA_DUPEFILTER_TTL``) starting together would
both pass them; the first to claim makes the crawl's, the other is refused at start."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import redis.exceptions

from scrapy_ha.config.validate import ConfigError
from scrapy_ha.store.connection import server_ms

if TYPE_CHECKING:
    from scrapy_ha.config.memory import MemoryConfig
    from scrapy_ha.store.queue import RedisQueue

__all__ = [
    "ClaimUnreadable",
    "claim_kind",
    "claimed_kind",
    "crawl_dupefilter",
    "dupefilter_kind",
]


class ClaimUnreadable(ConfigError):
    """The crawl's claim (``ha:{S}:filter``) holds what no worker wrote: the message names
    the key and what is wrong (the CLI exits with code 2)."""


def dupefilter_kind(config: MemoryConfig, ttl: float) -> str:
    """The kind a worker claims: ``set``, ``bloom``, or either in time slices with its TTL
    (``set sliced 3600``): workers of two TTLs would each drop the slices the other keeps
    (the shortest TTL would win for every worker, at once). The TTL is written exactly (a
    whole number as one, else as Python reads it back), so that two TTLs always differ."""
    return config.dupefilter + (f" sliced {_exact(ttl)}" if ttl else "")


def _exact(ttl: float) -> str:
    """``3600``, ``1234567``, ``0.1`` (never ``1.23457e+06``: 6 digits made 1234567 and
    1234568 one TTL)."""
    return str(int(ttl)) if ttl == int(ttl) else repr(float(ttl))


async def claimed_kind(queue: RedisQueue) -> tuple[str, float] | None:
    """The kind and TTL (0: kept for ever) the crawl's claim names, for an operator's tool
    that may run outside the crawl's project (its settings unknown); None when the crawl
    has no claim, or one of an earlier version (time slices without their TTL).
    :class:`ClaimUnreadable` when the claim is there but cannot be read."""
    key = queue.keys.filter_kind
    stored = await _stored(queue)
    if stored is None:
        return None
    try:
        return _read_claim(stored)
    except ValueError as exc:
        raise ClaimUnreadable(f"the crawl's claim {key} is unreadable: {exc}") from None


def _read_claim(stored: str) -> tuple[str, float] | None:
    """``set``, ``bloom sliced 3600``: the kind and TTL; a ValueError says what is wrong."""
    from scrapy_ha.config.continuous import MAX_DUPEFILTER_TTL, MIN_DUPEFILTER_TTL
    from scrapy_ha.config.memory import DUPEFILTERS

    name, *rest = stored.split(" ")
    if name not in DUPEFILTERS or rest[:1] not in ([], ["sliced"]) or len(rest) > 2:
        kinds = " or ".join(DUPEFILTERS)
        raise ValueError(f"{stored!r} is no dupefilter kind ({kinds}, then 'sliced' and a TTL)")
    if rest == ["sliced"]:
        return None  # an earlier version's: the TTL is the project's
    try:
        ttl = float(rest[1]) if rest else 0.0
    except ValueError:
        raise ValueError(f"its TTL {rest[1]!r} is no number") from None
    if ttl and not MIN_DUPEFILTER_TTL <= ttl <= MAX_DUPEFILTER_TTL:  # NaN and inf too
        raise ValueError(
            f"its TTL {rest[1]!r} is not 0 nor {MIN_DUPEFILTER_TTL:g} to {MAX_DUPEFILTER_TTL:g} s"
        )
    return name, ttl


async def _stored(queue: RedisQueue) -> str | None:
    """The claim as stored (bytes that are not UTF-8 replaced), None when there is none;
    :class:`ClaimUnreadable` when the key holds another type than a string."""
    key = queue.keys.filter_kind
    try:
        stored = await queue.client.get(key)
    except redis.exceptions.ResponseError as exc:
        if "WRONGTYPE" not in str(exc):
            raise
        held = _s(await queue.client.type(key))
        raise ClaimUnreadable(
            f"the crawl's claim {key} is unreadable: it holds a {held}, not a string"
        ) from None
    return None if stored is None else _s(stored)


async def crawl_dupefilter(
    queue: RedisQueue, config: MemoryConfig, ttl: float
) -> tuple[MemoryConfig, float]:
    """The dupefilter's kind and TTL as the crawl's workers have them, for an operator's
    tool: as its claim says (``ha:{S}:filter``: the tool may run outside the crawl's
    project), else *config* and *ttl* (the project's ``HA_DUPEFILTER`` and
    ``HA_DUPEFILTER_TTL``)."""
    claimed = await claimed_kind(queue)
    if claimed is None:
        return config, ttl
    kind, claimed_ttl = claimed
    return dataclasses.replace(config, dupefilter=kind), claimed_ttl


async def claim_kind(queue: RedisQueue, config: MemoryConfig, ttl: float, worker: str = "") -> None:
    """Record the crawl's dupefilter kind, or refuse a worker of another kind. The checks
    read what is stored, and a crawl is empty until a worker's first round: two workers of
    different kinds starting together both passed them, and each then kept its own filter
    (every URL one saw was new to the other). The first to get here claims the kind
    (``SET NX``), in Redis as long as the dupefilter itself."""
    kind = dupefilter_kind(config, ttl)
    key = queue.keys.filter_kind
    if await queue.client.set(key, kind, nx=True):
        return
    stored = await _stored(queue) or ""
    if not _agrees(stored, config, ttl) and not await _others_alive(queue, worker):
        # the claim outlived its crawl (an earlier version's finish or flush, which knows
        # no claim, cleared the crawl), or every worker of the crawl stopped and this one
        # comes with another TTL: no worker that could have made it is alive (a worker
        # registers before it claims); the crawl's stored data passed the checks
        await queue.client.delete(key)
        if await queue.client.set(key, kind, nx=True):
            return
        stored = await _stored(queue) or ""  # another worker claimed meanwhile
    if not _agrees(stored, config, ttl):
        raise ConfigError(
            f"{_kind_setting(kind)} but the crawl of {queue.keys.spider} in Redis has a "
            f"dupefilter of another kind, {_kind_setting(stored)} (key {key}, set by the "
            f"first worker): run every worker of the crawl with the same, or `scrapy-ha "
            f"flush {queue.keys.spider}` first to start it again"
        )


def _agrees(stored: str, config: MemoryConfig, ttl: float) -> bool:
    """Whether a worker of *config* and *ttl* may join a crawl that claimed *stored*:
    nothing claimed, the same, or the same as an earlier version wrote it (time slices
    without their TTL; the TTL to 6 significant digits, ``1.23457e+06``, which it cannot
    tell from a TTL of the same 6 digits)."""
    kind = dupefilter_kind(config, ttl)
    earlier = config.dupefilter + (f" sliced {ttl:g}" if ttl else "")
    if stored.endswith(" sliced"):
        return kind.startswith(stored)
    return stored in ("", kind, earlier)


async def _others_alive(queue: RedisQueue, worker: str) -> bool:
    """Whether a worker but *worker* is registered with the crawl now: its heartbeat (shard
    0's) or, in a sharded crawl, its join not expired."""
    keys, client = queue.keys, queue.client
    now = await server_ms(client)
    for where in (keys.workers, keys.joins):
        alive = {_s(m) for m in await client.zrangebyscore(where, now, "+inf")}
        if alive - {worker}:
            return True
    return False


def _kind_setting(kind: str) -> str:
    """The settings of a dupefilter kind as stored: ``bloom sliced 3600`` is
    ``HA_DUPEFILTER='bloom' with HA_DUPEFILTER_TTL=3600`` (an earlier version's claim names
    no TTL)."""
    name, _, rest = kind.partition(" ")
    setting = f"HA_DUPEFILTER={name!r}"
    if not rest:
        return setting
    ttl = rest.removeprefix("sliced").strip()
    return setting + " with HA_DUPEFILTER_TTL" + (f"={ttl}" if ttl else "")


def _s(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
