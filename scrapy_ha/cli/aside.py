"""``scrapy-ha items SPIDER --to SINK --aside`` and ``--retry-aside``: the entries a sink's
group set aside (``ha:{S}:items_aside``, see :mod:`scrapy_ha.sinks.batches`), listed, and
written to the sink once it (or the item) is fixed.

``--retry-aside`` writes each record's item to the sink under its original entry id (an
idempotent sink never stores it twice) and deletes the record only after the sink
committed it. A sink whose idempotence is its own (a JSON Lines file: ``shares = False``)
names at open what it committed last (the offset file's batch) and, for a file, what
``--retry-aside`` wrote to it (the offset file's ``retried``, carried over by the file's
consumer's batches: :mod:`scrapy_ha.sinks.jsonl`): a record among them was written by a
``--retry-aside`` killed before it deleted the record, and is deleted, not written again
(the batch names only lines the file holds). A record it cannot use is
reported and kept, never deleted: the group no longer reads the stream, the record lacks its
id or its item, or the sink stored nothing of it (``write`` returned 0: not an item it can
read). A record whose item a pipeline dropped (``DropItem``: the consumer acknowledges such
an entry too; an idempotent pipeline drops what it stored before a kill) is through:
deleted, and counted apart ("M dropped by the pipelines"). "N set-aside entries written"
counts records the sink stored (or had stored before a kill).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from scrapy_ha.codec.log_masking import one_line
from scrapy_ha.sinks.batches import Entry, global_id
from scrapy_ha.sinks.jsonl import JsonLinesSink
from scrapy_ha.store.items import ItemStream
from scrapy_ha.store.sharding import shards_of

if TYPE_CHECKING:
    from scrapy_ha.sinks.consumer import ItemConsumer, Sink
    from scrapy_ha.store.items import Aside
    from scrapy_ha.store.queue import RedisQueue

__all__ = ["list_aside", "retry_aside"]


def _streams(queue: RedisQueue) -> list[ItemStream]:
    return [ItemStream(q.client, q.keys) for q in shards_of(queue)]


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) if ms else "?"


async def list_aside(queue: RedisQueue, group: str) -> int:
    """Print what *group* set aside: id, when (UTC), reason (on one line)."""
    shown = 0
    for shard, stream in enumerate(_streams(queue)):
        for record in await stream.aside(group):
            entry = record.entry_id
            entry = global_id(shard, entry) if entry else f"? (record {record.record_id})"
            print(f"{entry}  {_when(record.when_ms)}  {one_line(record.reason)}")
            shown += 1
    print(f"{shown} entr{'y' if shown == 1 else 'ies'} set aside by group {group}")
    return 0


async def retry_aside(queue: RedisQueue, runner: ItemConsumer, ids: list[str] | None = None) -> int:
    """Write *runner*'s group's set-aside entries (with *ids*, only those entries: an
    operator skips one the sink keeps failing) to its sink; exit 1 if any is kept or an id
    is not found."""
    wanted = set(ids) if ids else None
    sink, group = runner.sink, runner.group
    recovered = await sink.open()
    await runner.acknowledge_recovered(recovered)
    committed = set(recovered) | await _journal(sink, queue, group)  # in the file already
    done = kept = 0
    dropped = getattr(sink, "dropped", 0)
    try:
        for shard, stream in enumerate(_streams(queue)):
            records = [
                r
                for r in await stream.aside(group)
                if wanted is None or global_id(shard, r.entry_id or "") in wanted
            ]
            if wanted is not None:
                wanted -= {global_id(shard, r.entry_id or "") for r in records}
            if records and not await stream.has_group(group):
                print(f"group {group} no longer reads {stream.key}: {len(records)} kept")
                kept += len(records)
                continue
            for record in records:
                problem = await _retry_one(sink, stream, shard, record, committed)
                if problem:
                    print(f"{record.entry_id or record.record_id}: {problem}: kept")
                    kept += 1
                else:
                    done += 1
    finally:
        await sink.close()
    for missing in sorted(wanted or ()):
        print(f"{missing}: no such entry set aside by group {group}")
    dropped = getattr(sink, "dropped", 0) - dropped
    done -= dropped
    written = f"{done} set-aside entr{'y' if done == 1 else 'ies'} written"
    if dropped:
        written += f", {dropped} dropped by the pipelines (deleted)"
    print(f"{written}, {kept} kept")
    return 1 if kept or wanted else 0


async def _journal(sink: Sink, queue: RedisQueue, group: str) -> set[str]:
    """What --retry-aside wrote to a JSON Lines file before (its offset file's ``retried``),
    but the ids whose records are deleted (they never come back); the sink then adds each
    id this run writes, and drops it again once its record is deleted (:func:`_drop`): the
    list holds what a killed run left, never every id a run wrote."""
    if not isinstance(sink, JsonLinesSink):
        return set()
    sink.journal = True
    waiting = set()
    for shard, stream in enumerate(_streams(queue)):
        waiting |= {global_id(shard, r.entry_id) for r in await stream.aside(group) if r.entry_id}
    sink.retried = [i for i in sink.retried if i in waiting]
    return set(sink.retried)


async def _retry_one(
    sink: Sink, stream: ItemStream, shard: int, record: Aside, committed: set[str]
) -> str | None:
    """Write one record's item (unless the sink has *committed* it already); delete the
    record once committed. What went wrong, else None."""
    entry_id, item = record.entry_id, record.item
    if entry_id is None or item is None:
        return "the record has no entry id or no item"
    if global_id(shard, entry_id) in committed:
        await _drop(sink, stream, shard, record)
        return None
    skipped, dropped = getattr(sink, "skipped", 0), getattr(sink, "dropped", 0)
    try:
        stored = await sink.write([Entry(global_id(shard, entry_id), item)])
    except Exception as exc:
        return f"the sink failed it ({type(exc).__name__}: {exc})"
    if getattr(sink, "skipped", 0) != skipped:
        return "the sink cannot read it as an item (left out)"
    if stored == 0 and getattr(sink, "dropped", 0) == dropped:  # kept, never deleted
        return "the sink stored nothing of it"
    await _drop(sink, stream, shard, record)
    return None


async def _drop(sink: Sink, stream: ItemStream, shard: int, record: Aside) -> None:
    """Delete *record*, its item in the sink; a file's journal forgets its id."""
    await stream.drop_aside(record.record_id)
    if isinstance(sink, JsonLinesSink) and record.entry_id:
        sink.forget_retried(global_id(shard, record.entry_id))
