"""Sharded crawls (``HA_SHARDS = N`` > 1): one crawl spread over N hash tags.

:class:`ShardedQueue` has :class:`~scrapy_ha.store.queue.RedisQueue`'s interface over N
per-shard queues (``{<spider>:0}`` ... ``{<spider>:N-1}``, see :mod:`scrapy_ha.keys`), so
that the session uses it unchanged and every script still touches one slot:

- a new request goes to the shard of its fingerprint (deduplication stays exact: each
  fingerprint is only ever checked in one dupefilter), a request of a checkpointed task to
  its task's shard (its checkpoint is saved there, fenced by the page's lease in the same
  call), a request never filtered to the next shard in turn;
- entry ids of different shards collide (each shard counts its own), so the worker sees
  ``"<shard>:<id>"`` for shards 1 and up; the prefix is stripped on the way back;
- children before acks holds across shards: every child is stored (in its own shard)
  before any ack of the same sync is sent;
- a child stored in another shard than its parent's lease is fenced by a renewal of that
  lease in the parent's shard just before (a lost parent's children are dropped as
  today); a lease just renewed is valid for ``HA_LEASE_TIME``, so a zombie is fenced up to
  that window, where one shard fences it in the same call;
- leases come from the shards in a fair rotation: each round starts at the shard after
  the one the previous round started at, and goes on to the next ones only while it
  wants more (no shard is starved);
- renewals, releases and reclaims go to each shard, counts are summed; what is crawl-wide
  (pause, heartbeats and worker stats, cookies, proxy cool-downs) is read on shard 0;
- a crawl that finished with more shards than the run now (``"<count> <span>"`` in its
  layout key) keeps its earlier shards: new requests are placed in the first ``count``,
  every shard up to ``span`` is leased from, renewed, reclaimed, counted and flushed (its
  dead letters, once requeued, are leased where they are);
- the last worker's finish clears every shard or none (:meth:`ShardedQueue.finish`): the
  finish record under the crawl's own tag fences the workers that join meanwhile.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy_ha.config.scheduler import DEFAULT_DLQ_MAX_AGE_MS, DEFAULT_DLQ_MAX_ENTRIES
from scrapy_ha.store.finish import finish_shards
from scrapy_ha.store.shard_sync import ShardedSync, outside
from scrapy_ha.store.wire import Counts, Finished, NewEntry, Reclaimed

if TYPE_CHECKING:
    from collections.abc import Iterable

    from scrapy_ha.store.shard_sync import Pair

logger = logging.getLogger(__name__)

__all__ = ["ShardedQueue", "outside"]

#: Milliseconds the start-URL feed guard of a sharded crawl lives: a worker that dies while
#: feeding lets another feed after this.
FEED_GUARD_MS = 30_000


class ShardedQueue(ShardedSync):
    """RedisQueue's interface over the N shards of one crawl (see the module's docstring):
    the sync and placement of :class:`ShardedSync`, and the leases, dead letters and the
    crawl as a whole here."""

    # -- leases ---------------------------------------------------------------------

    async def renew(
        self,
        pairs: list[Pair],
        *,
        worker: str,
        lease_ms: int,
        heartbeat_ms: int,
        handed: Iterable[Pair] = (),
        rate: float | None = None,
    ) -> tuple[int, list[Pair]]:
        """Renew in every shard that holds some of *pairs* (shard 0 always: the heartbeat
        and the worker's stats live there)."""
        self.worker, self.heartbeat_ms = worker, heartbeat_ms
        self._rate = rate
        handed = list(handed)
        by = self.split(pairs)
        handed_by = self.split(handed)
        renewed, lost = 0, []
        for shard in sorted({0, *by, *handed_by}):
            n, gone = await self._renew_shard(
                shard, by.get(shard, []), handed_by.get(shard, ()), lease_ms
            )
            renewed += n
            lost += self.theirs(shard, gone, [*pairs, *handed])
        self.live_workers = self.shards[0].live_workers
        return renewed, lost

    async def reclaim(
        self,
        *,
        worker: str,
        interval_ms: int,
        batch: int,
        max_expiries: int,
        max_entries: int = DEFAULT_DLQ_MAX_ENTRIES,
        max_age_ms: int = DEFAULT_DLQ_MAX_AGE_MS,
    ) -> Reclaimed | None:
        """Reclaim in every shard (each has its own guard); None if no shard was ours."""
        done, reclaimed, poison, aside = False, 0, [], 0
        for shard, queue in enumerate(self.shards):
            result = await queue.reclaim(
                worker=worker,
                interval_ms=interval_ms,
                batch=batch,
                max_expiries=max_expiries,
                max_entries=max_entries,
                max_age_ms=max_age_ms,
            )
            if result is None:
                continue
            done = True
            reclaimed += result.reclaimed
            poison += [self.outside(shard, i) for i in result.poison]
            aside += result.set_aside
        return Reclaimed(reclaimed, poison, aside) if done else None

    async def release(self, pairs: list[Pair]) -> int:
        released = 0
        for shard, local in sorted(self.split(pairs).items()):
            released += await self.shards[shard].release(local)
        for entry_id, _ in pairs:
            self._taken.pop(entry_id, None)
        return released

    async def dead_letter(
        self,
        entry_id: str,
        token: str,
        info: dict[str, Any],
        *,
        payload: bytes = b"",
        max_entries: int = DEFAULT_DLQ_MAX_ENTRIES,
        max_age_ms: int = DEFAULT_DLQ_MAX_AGE_MS,
    ) -> int:
        shard, local = self.route(entry_id)
        done = await self.shards[shard].dead_letter(
            local, token, info, payload=payload, max_entries=max_entries, max_age_ms=max_age_ms
        )
        self._taken.pop(entry_id, None)  # after the call: a failed one is retried in its shard
        return done

    async def retry_later(
        self,
        entry_id: str,
        token: str,
        delay_ms: int,
        payload: bytes,
        priority: int | None = None,
        failure_class: str = "",
        held: str = "gate",
    ) -> int:
        shard, local = self.route(entry_id)
        done = await self.shards[shard].retry_later(
            local, token, delay_ms, payload, priority, failure_class, held
        )
        self._taken.pop(entry_id, None)  # after the call: a failed one is retried in its shard
        return done

    async def close_gate(self, domain: str, ms: int) -> int:
        """Close *domain* in every shard: each sync reports its own shard's gates."""
        return max([await queue.close_gate(domain, ms) for queue in self.shards])

    async def requeue_dead(self, entries: list[tuple[str, int, bytes]]) -> int:
        by: dict[int, list[tuple[str, int, bytes]]] = {}
        for entry_id, priority, payload in entries:
            shard, local = self.route(entry_id)
            by.setdefault(shard, []).append((local, priority, payload))
        return sum([await self.shards[s].requeue_dead(e) for s, e in sorted(by.items())])

    async def purge_dead(self, ids: list[str]) -> tuple[int, int]:
        by: dict[int, list[str]] = {}
        for entry_id in ids:
            shard, local = self.route(entry_id)
            by.setdefault(shard, []).append(local)
        deleted = kept = 0
        for shard, shard_ids in sorted(by.items()):
            d, k = await self.shards[shard].purge_dead(shard_ids)
            deleted, kept = deleted + d, kept + k
        return deleted, kept

    async def save_checkpoint(
        self, entry_id: str, token: str, task: str, doc: bytes, ttl_ms: int
    ) -> int:
        """In the page's shard, which is its task's (checkpoint keys included)."""
        shard, local = self.route(entry_id)
        return await self.shards[shard].save_checkpoint(local, token, task, doc, ttl_ms)

    # -- the crawl as a whole -------------------------------------------------------

    async def counts(self) -> Counts:
        """Every shard's counts summed (each read atomically; the shards one after the
        other); workers are shard 0's (every worker heartbeats there)."""
        parts = [await queue.counts() for queue in self.shards]
        return Counts(
            parts[0].now_ms,
            sum(c.pending for c in parts),
            sum(c.leased for c in parts),
            sum(c.delayed for c in parts),
            sum(c.dead for c in parts),
            parts[0].workers,
            sum(c.fingerprints for c in parts),
        )

    async def finish(self, worker: str, *, keep: bool = False) -> Finished:
        """Clear the working keys of every shard once all of them are empty and no other
        worker lives, all or nothing (see :mod:`.finish`); with *keep*, drop the session
        cookies of the jars (on shard 0) alone."""
        return await finish_shards(self, worker, keep=keep)

    async def granted(self, worker: str) -> dict[bytes, bytes]:
        grant: dict[bytes, bytes] = {}
        for shard, queue in enumerate(self.shards):
            for entry_id, token in (await queue.granted(worker)).items():
                grant[self.outside(shard, entry_id.decode()).encode()] = token
        return grant

    async def exists(self) -> bool:
        if await self.client.exists(self.keys.shard_count):
            return True
        return any([await queue.exists() for queue in self.shards])

    async def feed(
        self, key: str, *, as_set: bool, raw: list[bytes], entries: list[NewEntry]
    ) -> int:
        """Enqueue the start URLs in their shards first, then take them out of *key*
        (-1 if another worker took the list's head first: its dupefilter check made the
        requests it enqueued again harmless)."""
        # Enqueueing in the shards and taking out of the list are two steps, and start
        # requests are never deduplicated: one worker at a time, under a guard that
        # expires if it dies, and only while the entries it read are still there.
        guard = self._home.keys.feed_guard
        if not await self.client.set(guard, "1", nx=True, px=FEED_GUARD_MS):
            return -1
        try:
            if not await self._still_there(key, as_set=as_set, raw=raw):
                return -1
            added = (await self.sync(enqueue=[e for e in entries if e.payload])).added
            blank = [NewEntry(b"", 0, b"") for _ in raw]
            # under the crawl's own tag, which the start key shares on a cluster (the check
            # at open): the script only takes the entries out (its counter ``seq`` goes up)
            taken = await self._home.feed(key, as_set=as_set, raw=raw, entries=blank)
            return -1 if taken < 0 else added
        finally:
            await self.client.delete(guard)

    async def _still_there(self, key: str, *, as_set: bool, raw: list[bytes]) -> bool:
        """The start entries read are still in *key* (no other worker took them meanwhile)."""
        if not raw:
            return True
        if as_set:
            present = await self.client.smismember(key, raw)
            return all(present)
        head = await self.client.lrange(key, 0, len(raw) - 1)
        return [bytes(x) for x in head] == [bytes(x) for x in raw]

    async def set_aside_wrong_types(self, error: str = "") -> list[str]:
        return [m for queue in self.shards for m in await queue.set_aside_wrong_types(error)]

    async def leave(self, worker: str, sender: str | None = None) -> None:
        for queue in self.shards:
            await queue.leave(worker, sender)
        await self.client.zrem(self.keys.joins, worker)

    async def upgrade(self) -> int:
        return sum([await queue.upgrade() for queue in self.shards])

    async def flush(self) -> None:
        for queue in [*self.shards, self._home]:
            await queue.flush()  # the crawl's own keys (layout, finish, joins) with each
