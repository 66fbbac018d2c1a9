"""How a crawl ends in Redis: the last worker of a finished crawl (nothing pending, leased
or delayed, no other worker alive) clears its working keys (``SCHEDULER_PERSIST=False``), or
drops the session cookies of its shared jars alone (``True``), in finish.lua; either way the
numbers in ``sent`` of workers gone for a day go (lib/senders.lua).

A sharded crawl's shards are other slots, cleared one call after the other: all or nothing.
The last worker takes the crawl's finish record first ('prepare', under the crawl's own
tag: fence.lua; refused while a worker joined lately), checks every shard and the
heartbeats, records its decision ('commit') and clears every shard, then records 'done'.
A worker that joins meanwhile waits (join.lua, :mod:`.join`), and clears the shards itself
if the finishing worker died before it was done.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any, Protocol

from scrapy_ha.store import scripts
from scrapy_ha.store.bloom import bitmap_keys, filter_metas
from scrapy_ha.store.buckets import bucket_state, delete_buckets
from scrapy_ha.store.frontier import relink_queues
from scrapy_ha.store.wire import SENT_GRACE_MS, Finished, _s

if TYPE_CHECKING:
    from collections.abc import Sequence

    from scrapy_ha.keys import Keys
    from scrapy_ha.store.wire import Counts


class Shard(Protocol):
    """What a finish needs of the queue of one shard (or of an unsharded crawl)."""

    client: Any
    keys: Keys

    async def finish(self, worker: str, *, keep: bool = False) -> Finished: ...


class Sharded(Protocol):
    """What a finish needs of a sharded crawl's queue."""

    client: Any
    keys: Keys

    @property
    def shards(self) -> Sequence[Shard]: ...

    async def counts(self) -> Counts: ...


__all__ = ["FINISH_STEP_MS", "Shard", "Sharded", "complete_finish", "finish_one", "finish_shards"]

#: Milliseconds each step of a sharded finish may take (fence.lua): a finish of 1,024 shards
#: makes some 3,100 calls (7 s with Redis 2.4 ms away), 30 s is four times that. A worker
#: that joins meanwhile waits; if the finishing worker died, it completes the finish after
#: this long (or, if the finish was still checking, forgets it: nothing was cleared).
FINISH_STEP_MS = 30_000


def working_keys(keys: Keys) -> list[str]:
    """The keys a finish clears (``SCHEDULER_PERSIST=False``) besides those it checks and
    the cookie jars. ``seq`` stays (the dead letters kept have ids, and a new entry must not
    take one), and so do ``sent`` and ``senders``: a worker stopped meanwhile and alive
    again must not see its number go back (it goes a day after it was seen gone)."""
    return [
        keys.worker_stats,
        keys.queued,
        keys.dupefilter,
        keys.buckets,
        keys.bloom,
        keys.aged,
        *keys.aged_slices(),
        keys.forget,
        keys.revisits,
        keys.revisit_urls,
        keys.expiries,
        keys.lease_seq,
        keys.reclaim_guard,
        keys.gates,
        keys.gate_log,
        keys.delayed_score,
        keys.held,
        keys.retried,
        keys.dlq_alert,
        keys.paused,
        keys.polite,
    ]


def finish_keys(keys: Keys, *, keep: bool) -> list[str]:
    """finish.lua's KEYS: those it checks, the cookie jars and the workers' numbers, then
    (unless *keep*) the finish record and the working keys."""
    checked = [keys.ready, keys.waiting, keys.leased, keys.delayed, keys.workers, keys.cookies]
    numbers = [keys.senders, keys.sent]
    return (
        [*checked, *numbers]
        if keep
        else [*checked, *numbers, keys.finish_record, *working_keys(keys)]
    )


async def finish_one(queue: Shard, worker: str, *, keep: bool) -> Finished:
    """End one shard's (or an unsharded crawl's) finished crawl in one script (a relink of
    its back queues owed first: else the finish would clear a crawl that holds requests)."""
    await relink_queues(queue.client, queue.keys, [])
    script = queue.client.register_script(scripts.FINISH_LUA)
    args = [worker, "keep" if keep else "clear", SENT_GRACE_MS]
    keys = finish_keys(queue.keys, keep=keep)
    buckets = None
    if not keep:  # a Bloom filter's bitmaps, as stored, go with its meta hash
        bloom, stored = await filter_metas(queue.client, queue.keys)
        keys += bitmap_keys(queue.keys, bloom)
        if queue.keys.shard is None:  # the crawl's own tag: the dupefilter's kind goes too
            keys.append(queue.keys.filter_kind)
        buckets = bucket_state(stored)
    finished = Finished.from_reply(await script(keys=keys, args=args))
    if finished:  # the buckets' meta hash went with the script: their sets go in batches
        await delete_buckets(queue.client, buckets, queue.keys)
    return finished


async def finish_shards(queue: Sharded, worker: str, *, keep: bool) -> Finished:
    """End a sharded crawl: every shard cleared or none (see the module's docstring)."""
    for shard in queue.shards:  # (a relink owed: see finish_one)
        await relink_queues(shard.client, shard.keys, [])
    if keep:
        if not await _finished(queue):
            return Finished(False)
        return await queue.shards[0].finish(worker, keep=True)
    token = secrets.token_hex(8)
    if not await _step(queue, "prepare", token):
        return Finished(False)
    decided = False
    try:
        decided = await _finished(queue) and await _step(queue, "commit", token)
    finally:
        if not decided:
            await _step(queue, "abort", token)
    return Finished(decided and await complete_finish(queue, token))


async def complete_finish(queue: Sharded, token: str) -> bool:
    """Clear every shard for the finish recorded under *token* ('commit'), then record it
    done; False if the record changed meanwhile (a worker that joined after its deadline
    completed it, and the crawl may run again: nothing more is cleared)."""
    for shard in queue.shards:
        record = _s(await queue.client.get(queue.keys.finish_record) or b"")
        if not record.startswith(f"commit {token} "):
            return False
        k = shard.keys
        bloom, stored = await filter_metas(shard.client, k)
        filters, buckets = bitmap_keys(k, bloom), bucket_state(stored)
        await shard.client.delete(k.workers, k.cookies, *working_keys(k), *filters)
        await delete_buckets(shard.client, buckets, k)
    record = _s(await queue.client.get(queue.keys.finish_record) or b"")
    if record.startswith(f"commit {token} "):  # still this finish's: no worker joined since
        await queue.client.delete(queue.keys.filter_kind)  # every shard's dupefilter went
    return await _step(queue, "done", token)


async def _finished(queue: Sharded) -> bool:
    """Nothing is pending, leased or delayed in any shard, and no worker is alive."""
    counts = await queue.counts()
    return not (counts.active or counts.workers)  # shard 0's heartbeats: we have left


async def _step(queue: Sharded, step: str, token: str) -> bool:
    fence = queue.client.register_script(scripts.FENCE_LUA)
    keys = [queue.keys.finish_record, queue.keys.joins]
    return bool(await fence(keys=keys, args=[step, token, FINISH_STEP_MS]))
