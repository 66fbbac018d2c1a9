"""The dead-letter queue of a crawl, as a Python API (the ``scrapy-ha dlq`` commands use it).

>>> async with DeadLetterQueue.from_url("redis://localhost:6379/0", "books") as dlq:
...     print([e.url for e in await dlq.entries(failure_class="gone")])
...     await dlq.requeue([e.id for e in await dlq.entries(domain="example.com")])

Requeue puts entries back in the pending queue with their attempt counters and history
reset; it is atomic per entry and idempotent (an entry already requeued is skipped). A
requeue lifts the hold of the crawl's failed logins (``login_once``'s *check*): the pages
go again once the credentials were mended.
Entries are read with the codec's :func:`~scrapy_ha.codec.describe`: a stored request is
data here, never rebuilt, so an entry this worker could not decode is listed all the same.
docs/reference.md has a complete script.
"""

from __future__ import annotations

__all__ = ["SCAN_BATCH", "DeadEntry", "DeadLetterQueue", "parse_entry"]

import json
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Self
from urllib.parse import urlsplit

from scrapy_ha.codec import RequestSummary, describe, reset_attempts
from scrapy_ha.codec.masking import mask_text, mask_url, mask_value
from scrapy_ha.config.bare import BareSettings
from scrapy_ha.deadletters.alerts import queue_shrunk
from scrapy_ha.deadletters.stream import Selection, selected
from scrapy_ha.keys import DEFAULT_PREFIX, Keys
from scrapy_ha.store.connection import redis_from_settings
from scrapy_ha.store.jars import lift_failed_logins
from scrapy_ha.store.payloads import read_payloads
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.times import time_ms
from scrapy_ha.store.zpaging import by_score

#: Seconds `DeadLetterQueue.from_url` waits to connect (scrapy-ha's HA_CONNECT_TIMEOUT default).
CONNECT_TIMEOUT = 5.0

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, AsyncIterator

#: Entries read per round trip when scanning the dead-letter queue.
SCAN_BATCH = 500
#: Entries requeued per call of the requeue script: each goes back to its host's queue, and
#: 500 a call held Redis, and every worker's call, 29 ms (a QA run, a worker's sync took
#: 1 ms there; 100 to 135 ms on a loaded machine); 100 a call hold it a fifth of that.
REQUEUE_BATCH = 100


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
        """Attempts made: the record's, else one per attempt of its history, else 1 (a
        record's garbage, a count that is not a whole number, falls back the same way)."""
        history = self.info.get("history")
        counted = len(history) if isinstance(history, list) else 0
        try:
            return int(self.info.get("attempts") or counted or 1)
        except (TypeError, ValueError, OverflowError):
            return counted or 1

    def as_dict(self) -> dict[str, Any]:
        """What ``scrapy-ha dlq export`` prints for this entry (secrets masked)."""
        return {
            "id": self.id,
            "url": mask_url(self.url),
            "method": self.summary.method,
            "class": self.failure_class,
            "reason": self.reason,
            "attempts": self.attempts,
            "status": self.info.get("status"),
            "first": self.info.get("first"),
            "last": self.info.get("last"),
            "dead_at": self.dead_at,
            "history": mask_value(self.info.get("history", [])),
        }

    def body(self) -> tuple[str, Any]:
        """The request body for a reader, its secret fields masked: ``("json", value)``
        when it is JSON, ``("text", str)`` when it is UTF-8 text, ``("bytes", str)`` with
        other bytes escaped, or ``("none", "")``."""
        raw = self.summary.shown_body
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


def info_class(info: bytes | None) -> str | None:
    """The class of a dead letter's record (JSON), None if it cannot be read."""
    try:
        doc = json.loads(info) if info else None
    except ValueError:
        return None
    return str(doc.get("class")) if isinstance(doc, dict) else None


def parse_entry(
    entry_id: str, dead_at: float, info: bytes | None, payload: bytes | None
) -> DeadEntry:
    """A dead-letter entry from its stored record (``dead_info``) and payload, as every tool
    reads it (``dlq``, the dashboard, the report, the archive), its reason masked; never
    raises on an unreadable record or payload."""
    try:
        meta = json.loads(info) if info else {}
    except ValueError:
        meta = None
    if not isinstance(meta, dict):  # not JSON, or JSON but no object (null, 7, [1]): by hand
        meta = {"class": "unknown", "reason": f"unreadable info: {info!r:.100}"}
    summary = describe(payload)  # unreadable: what it held, as a worker's record says it
    held = meta.get("payload") or (payload or b"?")[:200].decode("utf-8", "replace")
    return DeadEntry(
        entry_id,
        summary.url_or(str(held)),
        str(meta.get("class", "unknown")),
        mask_text(str(meta.get("reason", ""))),
        time_ms(dead_at),  # (a score written by hand, `inf` or 1e300: clamped)
        meta,
        summary,
    )


class _Record(NamedTuple):
    """A dead-letter entry before its request is read: id, time (ms), record (JSON)."""

    id: str
    dead_at: float
    info: bytes | None


def _bare(record: _Record) -> DeadEntry:
    """An entry's id, time and class (as :func:`parse_entry` reads it), nothing else."""
    try:
        meta = json.loads(record.info) if record.info else {}
    except ValueError:
        meta = None
    fclass = str(meta.get("class", "unknown")) if isinstance(meta, dict) else "unknown"
    return DeadEntry(record.id, "", fclass, "", time_ms(record.dead_at), summary=_NO_REQUEST)


#: The summary of an entry whose request is not read (one for all of them).
_NO_REQUEST = describe(None)


class DeadLetterQueue:
    """List, show, requeue, purge and export dead-letter entries of one crawl."""

    shrunk = staticmethod(queue_shrunk)  # (a shard's part of a merged queue: its own)
    lift = staticmethod(lift_failed_logins)  # (the crawl's jars: shard 0's, once)

    def __init__(self, queue: RedisQueue) -> None:
        self.queue = queue
        self.client = queue.client
        self.keys = queue.keys
        #: Entries the last :meth:`purge` kept because they are not archived yet.
        self.kept_unarchived = 0
        #: IDs the last :meth:`requeue` could not requeue: their stored request is gone.
        self.without_request: list[str] = []
        #: Holds of failed logins (``login_once``'s check) the last :meth:`requeue` lifted.
        self.logins_lifted = 0

    @classmethod
    def from_url(cls, url: str, spider: str, *, prefix: str = DEFAULT_PREFIX) -> Self:
        """The dead-letter queue of *spider*'s crawl in the Redis at *url* (keys under
        *prefix*, ``HA_KEY_PREFIX``; any URL ``REDIS_URL`` takes). Close it with `aclose`,
        or use ``async with``."""
        client = redis_from_settings(
            BareSettings.of({"REDIS_URL": url}), connect_timeout=CONNECT_TIMEOUT
        )
        return cls(RedisQueue(client, Keys(prefix, spider)))

    async def aclose(self) -> None:
        """Close the Redis connection."""
        await self.client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def scan(
        self, *, since_ms: int | None = None, until_ms: int | None = None, skip: int = 0
    ) -> AsyncIterator[DeadEntry]:
        """Every entry dead-lettered from *since_ms* to *until_ms* (Redis time, ms; both
        included), oldest first, the first *skip* of them skipped. Read by rank in batches:
        a page deep in a large queue costs what the page costs."""
        async for batch in self._records(since_ms, until_ms, skip):
            for entry in await self._read(batch):
                yield entry

    async def _records(
        self, since_ms: int | None, until_ms: int | None, skip: int
    ) -> AsyncIterator[list[_Record]]:
        """Batches of (id, dead-letter time, record) in the window, oldest first."""
        dead = self.keys.dead
        # read by score after the last one read, up to the window's end or the newest entry
        # at the start: never by rank, which entries leaving meanwhile shift (but the jump
        # past *skip*)
        ends = await self.client.zrange(dead, -1, -1, withscores=True)
        high = until_ms if until_ms is not None else ends[0][1] if ends else "+inf"
        first = None
        if skip:
            start, stop = await self._ranks(since_ms, until_ms)
            if start + skip > stop:
                return
            at = start + skip
            first = await self.client.zrange(dead, at, at + SCAN_BATCH - 1, withscores=True)
        low = "-inf" if since_ms is None else since_ms
        async for rows in by_score(self.client, dead, low, high, SCAN_BATCH, first):
            # (an id not UTF-8, written by hand, is shown escaped: the listing goes on)
            ids = [
                r[0].decode(errors="backslashreplace") if isinstance(r[0], bytes) else r[0]
                for r in rows
            ]
            infos = await self.client.hmget(self.keys.dead_info, ids)
            yield [
                _Record(entry_id, score, info)
                for (_, score), entry_id, info in zip(rows, ids, infos, strict=True)
            ]

    async def _read(self, records: list[_Record], *, requests: bool = True) -> list[DeadEntry]:
        """The entries of *records*, with their requests (one round trip); without
        *requests*, each entry's id, time and class alone (what a listing's widths need)."""
        if not requests:
            return [_bare(r) for r in records]
        payloads = await read_payloads(self.client, self.keys, [r.id for r in records])
        return [
            parse_entry(r.id, r.dead_at, r.info, payload)
            for r, payload in zip(records, payloads, strict=True)
        ]

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
        sel = Selection(failure_class, domain, reason, status, since_ms, until_ms, offset, limit)
        return [e async for batch in self.batches(sel) for e in batch]

    def batches(
        self, selection: Selection, *, requests: bool = True
    ) -> AsyncGenerator[list[DeadEntry]]:
        """The entries *selection* selects, oldest first, a batch at a time (see
        :mod:`~scrapy_ha.deadletters.stream`); without *requests*, their records alone."""
        return selected(self, selection, requests=requests)

    async def get(self, entry_id: str) -> DeadEntry | None:
        dead_at = await self.client.zscore(self.keys.dead, entry_id)
        if dead_at is None:
            return None
        info = await self.client.hget(self.keys.dead_info, entry_id)
        (payload,) = await read_payloads(self.client, self.keys, [entry_id])
        return parse_entry(entry_id, dead_at, info, payload)

    async def requeue(self, ids: list[str]) -> int:
        """Back to pending with attempts reset; return how many were requeued. An entry
        whose stored request is gone stays, named in :attr:`without_request` (an id that
        is no dead letter, requeued or purged already, is skipped, not named there)."""
        requeued = 0
        self.without_request = []
        for start in range(0, len(ids), REQUEUE_BATCH):
            chunk = ids[start : start + REQUEUE_BATCH]
            payloads = await read_payloads(self.client, self.keys, chunk)
            if lacking := [i for i, p in zip(chunk, payloads, strict=True) if p is None]:
                dead = await self.client.zmscore(self.keys.dead, lacking)
                self.without_request += [
                    i for i, at in zip(lacking, dead, strict=True) if at is not None
                ]
            entries = [
                (entry_id, describe(payload).priority, reset_attempts(payload))
                for entry_id, payload in zip(chunk, payloads, strict=True)
                if payload is not None
            ]
            requeued += await self.queue.requeue_dead(entries)
        await self.shrunk(self.client, self.keys)  # below the alert's threshold again?
        # the pages requeued go again with mended credentials: no failed login holds them
        self.logins_lifted = await self.lift(self.client, self.keys) if requeued else 0
        return requeued

    async def purge(self, ids: list[str]) -> int:
        """Delete for good; return how many were deleted. With an SQL archive declared for
        the crawl (``HA_DLQ_ARCHIVE_URL``), entries not archived yet are kept: their number
        is in :attr:`kept_unarchived` (``scrapy-ha dlq archive`` copies them)."""
        deleted = self.kept_unarchived = 0
        for i in range(0, len(ids), SCAN_BATCH):
            done, kept = await self.queue.purge_dead(ids[i : i + SCAN_BATCH])
            deleted += done
            self.kept_unarchived += kept
        await self.shrunk(self.client, self.keys)  # below the alert's threshold again?
        return deleted
