"""Dead letters selected by their filters, read a batch at a time: what the ``dlq``
commands list, export, requeue and purge, and what :meth:`DeadLetterQueue.entries`
returns. Memory stays that of a batch whatever the size of the queue (a QA run: 100,000
entries held at once cost ``dlq list`` 288 MB); a sharded crawl's shards come merged,
oldest first, as one sort of them all would put them (the lower shard first at a tie).
"""

from __future__ import annotations

__all__ = ["RecordFilter", "Selection", "merged", "selected"]

import json
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable

#: A :class:`~scrapy_ha.deadletters.dlq.DeadLetterQueue` and its entries: not imported
#: here (it imports this module).
DeadLetterQueue: TypeAlias = Any
DeadEntry: TypeAlias = Any


@dataclass(frozen=True)
class Selection:
    """Which entries: every filter given (None: any), the first *offset* matches skipped,
    at most *limit* of them; *since_ms*/*until_ms* the time each was dead-lettered."""

    failure_class: str | None = None
    domain: str | None = None
    reason: str | None = None
    status: int | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    offset: int = 0
    limit: int | None = None


@dataclass(frozen=True)
class RecordFilter:
    """The filters a dead-letter record answers alone (no need to read the request)."""

    failure_class: str | None
    reason: str | None
    status: int | None

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self.failure_class, self.reason, self.status))

    def keeps(self, info: bytes | None) -> bool:
        if not self.active:
            return True
        try:
            record = json.loads(info) if info else {}
        except ValueError:
            record = {}
        record = record if isinstance(record, dict) else {}
        return (
            (self.failure_class is None or record.get("class", "unknown") == self.failure_class)
            and (self.status is None or record.get("status") == self.status)
            and (
                self.reason is None or self.reason.lower() in str(record.get("reason", "")).lower()
            )
        )


async def selected(
    dlq: DeadLetterQueue, sel: Selection, *, requests: bool = True
) -> AsyncGenerator[list[DeadEntry]]:
    """The entries of one queue (one shard) that *sel* selects, oldest first, a batch at
    a time. Without *requests*, the stored requests are not read unless ``--domain`` needs
    them (an entry's id, time, class and reason are its record's)."""
    by_record = RecordFilter(sel.failure_class, sel.reason, sel.status)
    by_content = by_record.active or sel.domain is not None
    offset, limit, found = sel.offset, sel.limit, 0
    skip, offset = (0, offset) if by_content else (offset, 0)  # no filter: Redis skips
    async for batch in dlq._records(sel.since_ms, sel.until_ms, skip):
        kept = [r for r in batch if by_record.keeps(r.info)]
        if sel.domain is None:  # the record decides: skip and cut before reading requests
            dropped = min(offset, len(kept))
            kept, offset = kept[dropped:], offset - dropped
            if limit is not None:
                kept = kept[: limit - found]
        read = await dlq._read(kept, requests=requests or sel.domain is not None)
        out = []
        for entry in read:
            if sel.domain is not None and entry.domain != sel.domain:
                continue
            if offset:
                offset -= 1
                continue
            out.append(entry)
        if limit is not None:
            out = out[: limit - found]
        found += len(out)
        if out:
            yield out
        if limit is not None and found >= limit:
            return


async def merged(
    parts: list[DeadLetterQueue],
    outside: Callable[[int, DeadEntry], DeadEntry],
    sel: Selection,
    *,
    requests: bool = True,
    batch: int = 500,
) -> AsyncGenerator[list[DeadEntry]]:
    """As :func:`selected`, across the shards *parts* (each entry named by *outside*):
    each shard gives its first *offset* + *limit* matches, merged oldest first, the page
    asked for kept, in batches of *batch*."""
    per_shard = Selection(
        sel.failure_class,
        sel.domain,
        sel.reason,
        sel.status,
        sel.since_ms,
        sel.until_ms,
        0,
        None if sel.limit is None else sel.offset + sel.limit,
    )
    streams = [_entries(selected(p, per_shard, requests=requests)) for p in parts]
    heads: dict[int, DeadEntry] = {}
    offset, left, out = sel.offset, sel.limit, []
    try:
        for i, stream in enumerate(streams):
            if (first := await anext(stream, None)) is not None:
                heads[i] = first
        while heads and left != 0:  # the oldest head next (the lower shard first at a tie)
            i = min(heads, key=lambda k: (heads[k].dead_at, k))
            entry = heads.pop(i)
            if (following := await anext(streams[i], None)) is not None:
                heads[i] = following
            if offset:
                offset -= 1
                continue
            out.append(outside(i, entry))
            left = None if left is None else left - 1
            if len(out) >= batch:
                yield out
                out = []
        if out:
            yield out
    finally:
        for stream in streams:
            await stream.aclose()


async def _entries(batches: AsyncGenerator[list[DeadEntry]]) -> AsyncGenerator[DeadEntry]:
    async with aclosing(batches):
        async for some in batches:
            for entry in some:
                yield entry
