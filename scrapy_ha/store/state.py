"""The middlewares' state in Redis: task checkpoints, proxy cool-downs and the crawl-wide
per-domain limits.

Each store wraps a ``redis.asyncio`` client and the crawl's :class:`~scrapy_ha.keys.Keys`;
it is the only code that knows how its data is laid out in Redis, for the middlewares and
the ``scrapy-ha checkpoints`` commands alike. Checkpoints are *written* by the scheduler,
under the page's lease (a Lua script fenced by the lease token, see :mod:`scrapy_ha.store.queue`);
this store reads and deletes them.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from scrapy_ha.config.politeness import describe, limits_in_force
from scrapy_ha.store.scripts import Registered

if TYPE_CHECKING:
    import redis.asyncio

    from scrapy_ha.keys import Keys

__all__ = [
    "CheckpointStore",
    "ProxyCooldowns",
    "StoredCheckpoint",
    "UnreadableCheckpoint",
    "set_domain_limits",
    "wrong_task_keys",
]

logger = logging.getLogger(__name__)

#: The key a scrapy-ha script's WRONGTYPE error names (lib/types, lib/checkpoint).
_WRONGTYPE_KEY = re.compile(r"WRONGTYPE \w+: (.+?) holds a ")

#: Keys asked for per SCAN round trip: a few hundred checkpoints per call, without holding
#: the server for long.
SCAN_COUNT = 500


class UnreadableCheckpoint(ValueError):
    """A task's checkpoint key holds something that is not a checkpoint (not a JSON object,
    or not a string at all): garbage, which only ``checkpoints reset`` removes."""


@dataclass(frozen=True)
class StoredCheckpoint:
    """One task's checkpoint as stored: the task, the document, its size in bytes; an
    unreadable one has no document (``doc`` None) and says why in ``problem``."""

    task: str
    doc: dict[str, Any] | None
    size: int
    problem: str = ""


class CheckpointStore:
    """Read and delete the checkpoints of one crawl (``ha:{spider}:cp:<task>``)."""

    def __init__(self, client: redis.asyncio.Redis, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    async def get(self, task: str) -> dict[str, Any] | None:
        """The checkpoint of *task*, None if it has none (never saved, expired or reset).
        Raises :class:`UnreadableCheckpoint` if its key holds garbage."""
        raw = await self._raw(task)
        return _decode(raw) if raw else None

    async def _raw(self, task: str) -> bytes | str | None:
        try:
            raw: bytes | str | None = await self.client.get(self.keys.checkpoint(task))
        except ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            kind = _text(await self.client.type(self.keys.checkpoint(task)))
            raise UnreadableCheckpoint(f"its key holds a {kind}, not a string") from None
        return raw

    async def tasks(self) -> list[str]:
        """Every task with a checkpoint, sorted."""
        found = {
            _text(key).split("}:cp:", 1)[1]  # the task, after the crawl's tag
            async for key in self.client.scan_iter(
                match=self.keys.checkpoint_pattern, count=SCAN_COUNT
            )
        }
        return sorted(found)

    async def entries(self) -> list[StoredCheckpoint]:
        """Every checkpoint, by task (one expiring between the scan and the read is left
        out); an unreadable one is listed with its problem, never stops the others."""
        found = []
        for task in await self.tasks():
            raw = None
            try:
                raw = await self._raw(task)
                if raw is not None:
                    found.append(StoredCheckpoint(task, shaped(_decode(raw)), len(raw)))
            except UnreadableCheckpoint as exc:
                found.append(StoredCheckpoint(task, None, len(raw or b""), str(exc)))
        return found

    async def missing(self, tasks: list[str]) -> list[str]:
        """The *tasks* that have no checkpoint (neither a checkpoint nor pages ahead)."""
        found = [
            await self.client.exists(self.keys.checkpoint(t), self.keys.checkpoint_ahead(t))
            for t in tasks
        ]
        return [t for t, n in zip(tasks, found, strict=True) if not n]

    async def exists(self) -> bool:
        """Whether the crawl has any checkpoint."""
        async for _ in self.client.scan_iter(match=self.keys.checkpoint_pattern, count=SCAN_COUNT):
            return True
        return False

    async def delete(self, tasks: list[str]) -> int:
        """Delete the checkpoints of *tasks*: they start from their first page again.
        Returns how many existed."""
        if not tasks:
            return 0
        await self.client.delete(*(self.keys.checkpoint_ahead(t) for t in tasks))
        return int(await self.client.delete(*(self.keys.checkpoint(t) for t in tasks)))

    async def delete_all(self) -> int:
        """Delete every checkpoint of the crawl; returns how many there were."""
        return await self.delete(await self.tasks())


class ProxyCooldowns:
    """Proxies out of rotation, shared by every worker of a crawl.

    One hash (``Keys.proxy_cooldowns``): proxy id -> until when, in milliseconds of the
    Redis server's clock (workers' clocks differ). The hash expires with its newest
    cool-down, so it never outlives its use.
    """

    def __init__(self, client: redis.asyncio.Redis, keys: Keys) -> None:
        self.client = client
        self.key = keys.proxy_cooldowns

    async def load(self, server_ms: int) -> dict[str, int]:
        """Cool-downs still running at *server_ms* (proxy id -> until, server ms); those
        over, or unreadable, are deleted in the same script (a fresh one another worker
        writes meanwhile is never deleted as the expired one read before)."""
        flat = await Registered(self.client, "proxy_cd_load")(keys=[self.key], args=[server_ms])
        return {_text(k): _ms(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}

    async def mark(self, proxy: str, server_ms: int, cooldown_ms: int) -> None:
        """Put *proxy* out of rotation for *cooldown_ms* from *server_ms*."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(self.key, proxy, server_ms + cooldown_ms)
            pipe.pexpire(self.key, cooldown_ms)
            await pipe.execute()


async def set_domain_limits(
    client: redis.asyncio.Redis, keys: Keys, limits: dict[str, str]
) -> None:
    """Put this worker's per-domain limits in force for the crawl (``{}``: none), as
    the limits hash holds them (see :mod:`scrapy_ha.config.politeness`): the last worker to
    start sets them, so every worker of a crawl should have the same settings."""
    key = keys.domain_limits
    before = {_text(f): _text(v) for f, v in (await client.hgetall(key)).items()}
    old = set(before) - set(limits)
    if before and before != limits:  # (before: replaced without a word)
        logger.warning(
            "This worker's domain limits (HA_DOMAIN_*) replace those in force for the "
            "crawl, for every worker: %s, were %s (the last worker to start sets them: "
            "give every worker the same settings)",
            describe(limits_in_force(limits), {}) or "none",
            describe(limits_in_force(before), {}) or "none",
        )
    if limits:  # new ones first: never a moment without the limits in force
        await client.hset(key, mapping=limits)  # type: ignore[arg-type]
    if old:
        await client.hdel(key, *old)


def wrong_task_keys(keys: Keys, message: str) -> dict[str, str]:
    """The task keys of *keys*' shard (a checkpoint: a string, its ahead hash: a hash) that
    a WRONGTYPE error *message* names, with the type each must have: named by their task,
    they are not in the crawl's table of keys, so the error names them to be set aside."""
    head = f"{keys.prefix}:{{{keys.tag}}}:"
    kinds = {head + "cp:": "string", head + "cpa:": "hash"}
    return {
        key: want
        for key in _WRONGTYPE_KEY.findall(message)
        for start, want in kinds.items()
        if key.startswith(start)
    }


def _decode(raw: bytes | str) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError:  # not JSON, or not UTF-8
        doc = None
    if not isinstance(doc, dict):
        raise UnreadableCheckpoint("it is not a JSON object")
    return doc


def shaped(doc: dict[str, Any]) -> dict[str, Any]:
    """*doc* if the scripts read it as a task's checkpoint (lib/checkpoint.lua: done, or at
    a page number); else :class:`UnreadableCheckpoint`: the next page of its task replaces
    it."""
    page = doc.get("page")
    if ("done" in doc and doc["done"] is not False) or (
        isinstance(page, int | float) and not isinstance(page, bool)
    ):
        return doc
    raise UnreadableCheckpoint("no page number, not done: the next page of its task replaces it")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _ms(value: bytes | str) -> int:
    try:
        return int(float(value))
    except (ValueError, OverflowError):
        return 0  # garbage: treated as expired, and deleted
