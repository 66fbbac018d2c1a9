"""The dead-letter queue of a crawl, as a Python API (the ``scrapy-ha dlq`` commands use it).

>>> async with DeadLetterQueue.from_url("redis://localhost:6379/0", "books") as dlq:
...     print([e.url for e in await dlq.entries(failure_class="gone")])
...     await dlq.requeue([e.id for e in await dlq.entries(domain="example.com")])

Requeue puts entries back in the pending queue with their attempt counters and history
reset; it is atomic per entry and idempotent (an entry already requeued is skipped).
Entries are read with the codec's :func:`~scrapy_ha.codec.describe`: a stored request is
data here, never rebuilt, so an entry this worker could not decode is listed all the same.
docs/reference.md has a complete script.
"""

from __future__ import annotations

__all__ = ["SCAN_BATCH", "DeadEntry", "DeadLetterQueue"]

import json
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import urlsplit

import redis.asyncio

from scrapy_ha._queue import RedisQueue
from scrapy_ha.codec import RequestSummary, describe, reset_attempts
from scrapy_ha.keys import DEFAULT_PREFIX, Keys

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from types import TracebackType

#: Entries read per round trip when scanning the dead-letter queue.
SCAN_BATCH = 500


@dataclass(frozen=True)
class DeadEntry:
    """One dead-letter entry: the request (credentials already stripped) and why it died."""

    id: str
    url: str
    failure_class: str
    reason: str
    dead_at: int
    info: dict[str, Any] = field(default_factory=dict)
    #: The stored request as the codec reads it without rebuilding it.
    summary: RequestSummary = field(default_factory=lambda: describe(None))

    @property
    def cls(self) -> str:
        """Deprecated: use :attr:`failure_class`."""
        warnings.warn(
            "DeadEntry.cls is deprecated, use DeadEntry.failure_class",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.failure_class

    @property
    def request(self) -> dict[str, Any]:
        """The stored request document (``json.loads`` of the payload; ``{}`` if unreadable)."""
        return self.summary.document

    @property
    def domain(self) -> str:
        return urlsplit(self.url).hostname or ""

    @property
    def attempts(self) -> int:
        return int(self.info.get("attempts") or len(self.info.get("history") or []) or 1)

    def as_dict(self) -> dict[str, Any]:
        """What ``scrapy-ha dlq export`` prints for this entry."""
        return {
            "id": self.id,
            "url": self.url,
            "method": self.summary.method,
            "class": self.failure_class,
            "reason": self.reason,
            "attempts": self.attempts,
            "status": self.info.get("status"),
            "first": self.info.get("first"),
            "last": self.info.get("last"),
            "dead_at": self.dead_at,
            "history": self.info.get("history", []),
        }

    def body(self) -> tuple[str, Any]:
        """The request body for a reader: ``("json", value)`` when it is JSON, ``("text",
        str)`` when it is UTF-8 text, ``("bytes", str)`` with other bytes escaped, or
        ``("none", "")``."""
        raw = self.summary.body
        if not raw:
            return "none", ""
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            return "bytes", _escape(raw)
        try:
            return "json", json.loads(text)
        except ValueError:
            return "text", text

    @property
    def status(self) -> int | None:
        """The HTTP status of the last attempt (None for a download error)."""
        status = self.info.get("status")
        return status if isinstance(status, int) else None

    def matches(
        self,
        *,
        failure_class: str | None,
        domain: str | None,
        reason: str | None,
        status: int | None = None,
    ) -> bool:
        return (
            (failure_class is None or self.failure_class == failure_class)
            and (domain is None or self.domain == domain)
            and (reason is None or reason.lower() in self.reason.lower())
            and (status is None or self.status == status)
        )


def _escape(raw: bytes) -> str:
    """Printable ASCII as is, every other byte (and the backslash) as ``\\xNN``."""
    return "".join(chr(b) if 32 <= b < 127 and b != 92 else f"\\x{b:02x}" for b in raw)


def _parse(entry_id: str, dead_at: float, info: bytes | None, payload: bytes | None) -> DeadEntry:
    try:
        meta = json.loads(info) if info else {}
    except ValueError:
        meta = {"class": "unknown", "reason": f"unreadable info: {info!r:.100}"}
    summary = describe(payload)
    return DeadEntry(
        entry_id,
        summary.url if summary.url is not None else str(meta.get("payload", "?")),
        str(meta.get("class", "unknown")),
        str(meta.get("reason", "")),
        int(dead_at),
        meta,
        summary,
    )


class DeadLetterQueue:
    """List, show, requeue, purge and export dead-letter entries of one crawl."""

    def __init__(self, queue: RedisQueue) -> None:
        self.queue = queue
        self.client = queue.client
        self.keys = queue.keys

    @classmethod
    def from_url(cls, url: str, spider: str, *, prefix: str = DEFAULT_PREFIX) -> Self:
        """The dead-letter queue of *spider*'s crawl in the Redis at *url* (keys under
        *prefix*, ``HA_KEY_PREFIX``). Close it with `aclose`, or use ``async with``."""
        return cls(RedisQueue(redis.asyncio.Redis.from_url(url), Keys(prefix, spider)))

    async def aclose(self) -> None:
        """Close the Redis connection."""
        await self.client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def scan(
        self, *, since_ms: int | None = None, until_ms: int | None = None, skip: int = 0
    ) -> AsyncIterator[DeadEntry]:
        """Every entry dead-lettered from *since_ms* to *until_ms* (Redis time, ms; both
        included), oldest first, the first *skip* of them skipped. Read by rank in batches:
        a page deep in a large queue costs what the page costs."""
        start, stop = await self._ranks(since_ms, until_ms)
        start += skip
        while start <= stop:
            end = min(stop, start + SCAN_BATCH - 1)
            rows = await self.client.zrange(self.keys.dead, start, end, withscores=True)
            if not rows:
                return
            ids = [r[0].decode() if isinstance(r[0], bytes) else r[0] for r in rows]
            infos = await self.client.hmget(self.keys.dead_info, ids)
            payloads = await self.client.hmget(self.keys.payload, ids)
            for (_, score), entry_id, info, payload in zip(rows, ids, infos, payloads, strict=True):
                yield _parse(entry_id, score, info, payload)
            start += len(rows)

    async def _ranks(self, since_ms: int | None, until_ms: int | None) -> tuple[int, int]:
        """The ranks of the first and last entry within the time window (ZCOUNT: log N)."""
        dead = self.keys.dead
        first = 0 if since_ms is None else await self.client.zcount(dead, "-inf", f"({since_ms}")
        if until_ms is None:
            last = await self.client.zcard(dead) - 1
        else:
            last = await self.client.zcount(dead, "-inf", until_ms) - 1
        return int(first), int(last)

    async def count(self, *, since_ms: int | None = None, until_ms: int | None = None) -> int:
        """How many entries were dead-lettered within the time window (all: no window)."""
        first, last = await self._ranks(since_ms, until_ms)
        return max(0, last - first + 1)

    async def entries(
        self,
        *,
        failure_class: str | None = None,
        domain: str | None = None,
        reason: str | None = None,
        status: int | None = None,
        since_ms: int | None = None,
        until_ms: int | None = None,
        offset: int = 0,
        limit: int | None = None,
        cls: str | None = None,
    ) -> list[DeadEntry]:
        """Entries matching every filter given, oldest first: *reason* a case-insensitive
        substring, *status* the HTTP status, *since_ms*/*until_ms* the time it was
        dead-lettered (Redis time, ms); the first *offset* matches skipped, at most *limit*
        returned. ``cls`` is the deprecated name of ``failure_class``."""
        if cls is not None:
            warnings.warn(
                "entries(cls=...) is deprecated, use entries(failure_class=...)",
                DeprecationWarning,
                stacklevel=2,
            )
            failure_class = failure_class or cls
        by_content = any(v is not None for v in (failure_class, domain, reason, status))
        skip, offset = (0, offset) if by_content else (offset, 0)  # no filter: Redis skips
        found: list[DeadEntry] = []
        async for entry in self.scan(since_ms=since_ms, until_ms=until_ms, skip=skip):
            if not entry.matches(
                failure_class=failure_class, domain=domain, reason=reason, status=status
            ):
                continue
            if offset:
                offset -= 1
                continue
            found.append(entry)
            if limit is not None and len(found) >= limit:
                break
        return found

    async def get(self, entry_id: str) -> DeadEntry | None:
        dead_at = await self.client.zscore(self.keys.dead, entry_id)
        if dead_at is None:
            return None
        info = await self.client.hget(self.keys.dead_info, entry_id)
        payload = await self.client.hget(self.keys.payload, entry_id)
        return _parse(entry_id, dead_at, info, payload)

    async def requeue(self, ids: list[str]) -> int:
        """Back to pending with attempts reset; return how many were requeued."""
        requeued = 0
        for start in range(0, len(ids), SCAN_BATCH):
            chunk = ids[start : start + SCAN_BATCH]
            payloads = await self.client.hmget(self.keys.payload, chunk)
            entries = [
                (entry_id, describe(payload).priority, reset_attempts(payload))
                for entry_id, payload in zip(chunk, payloads, strict=True)
                if payload is not None
            ]
            requeued += await self.queue.requeue_dead(entries)
        return requeued

    async def purge(self, ids: list[str]) -> int:
        """Delete for good; return how many were deleted."""
        return sum(
            [
                await self.queue.purge_dead(ids[i : i + SCAN_BATCH])
                for i in range(0, len(ids), SCAN_BATCH)
            ]
        )
