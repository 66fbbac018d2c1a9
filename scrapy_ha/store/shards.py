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
  (pause, heartbeats and worker stats, cookies, proxy cool-downs) is read on shard 0.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from scrapy_ha.config import validate as check
from scrapy_ha.config.scheduler import DEFAULT_DLQ_MAX_AGE_MS, DEFAULT_DLQ_MAX_ENTRIES
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.keys import Keys, shard_of, task_shard
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import (
    Counts,
    NewEntry,
    Reclaimed,
    SyncResult,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

    from scrapy.settings import BaseSettings

    from scrapy_ha.store.wire import Sender

logger = logging.getLogger(__name__)

__all__ = ["ShardedQueue", "check_shard_count", "make_queue", "shard_setting"]

#: Default shard count: one hash tag, the key names of an unsharded crawl.
DEFAULT_SHARDS = 1
#: Milliseconds the start-URL feed guard of a sharded crawl lives: a worker that dies while
#: feeding lets another feed after this.
FEED_GUARD_MS = 30_000
#: Most shards: one script call per shard per round when the crawl is idle; more shards
#: than cluster masters (times a few, for rebalancing) buy nothing.
MAX_SHARDS = 1024

Pair = tuple[str, str]


def shard_setting(settings: BaseSettings) -> int:
    """``HA_SHARDS``, checked (a ConfigError names the setting and the value)."""
    shards = check.whole(settings, "HA_SHARDS", DEFAULT_SHARDS)
    if shards > MAX_SHARDS:
        raise ConfigError(f"HA_SHARDS={shards} must be {MAX_SHARDS} or fewer")
    return shards


def make_queue(
    client: Any,
    prefix: str,
    spider: str,
    shards: int,
    *,
    order: str = "fifo",
    start_order: str = "",
    worker: str = "",
    heartbeat_ms: int = 60000,
) -> RedisQueue:
    """The crawl's queue: a RedisQueue at one shard, a ShardedQueue beyond."""
    if shards == 1:
        return RedisQueue(client, Keys(prefix, spider), order=order, start_order=start_order)
    return ShardedQueue(
        client,
        Keys(prefix, spider, 0, shards),
        order=order,
        start_order=start_order,
        worker=worker,
        heartbeat_ms=heartbeat_ms,
    )


def outside(shard: int, entry_id: str) -> str:
    """The id the worker sees of an entry of *shard*."""
    return entry_id if shard == 0 else f"{shard}:{entry_id}"


def _stages(
    placed: list[tuple[int, NewEntry]], route: Callable[[str], tuple[int, str]]
) -> Iterator[list[tuple[int, NewEntry]]]:
    """*placed* in stages: a child whose parent is in the same batch, in another shard, waits
    for a later stage (its parent is then stored, or dropped, when its fence is checked);
    in the parent's own shard the script itself checks them in order."""
    unsent = {e.taken for _, e in placed if e.taken is not None}
    todo = placed
    while todo:
        ready: list[tuple[int, NewEntry]] = []
        later: list[tuple[int, NewEntry]] = []
        for shard, e in todo:
            waits = e.parent is not None and e.parent in unsent and route(e.parent[0])[0] != shard
            (later if waits else ready).append((shard, e))
        if not ready:  # cannot happen (a request is not its own ancestor): send as they are
            ready, later = later, []
        yield ready
        unsent -= {e.taken for _, e in ready if e.taken is not None}
        todo = later


def shards_of(queue: RedisQueue) -> list[RedisQueue]:
    """The per-shard queues of *queue* (itself when it is not sharded)."""
    return list(queue.shards) if isinstance(queue, ShardedQueue) else [queue]


async def check_shard_count(queue: RedisQueue) -> None:
    """Refuse a worker whose ``HA_SHARDS`` differs from the crawl's in Redis (it would look
    for requests in the wrong shards); the first worker of a sharded crawl writes it."""
    keys = queue.keys
    wanted = keys.shards
    stored = await queue.client.get(keys.shard_count)
    if stored is None:
        unsharded = RedisQueue(queue.client, Keys(keys.prefix, keys.spider))
        if wanted > 1 and await unsharded.exists():
            raise ConfigError(
                f"HA_SHARDS={wanted} but the crawl of {keys.spider} is in Redis unsharded "
                f"(HA_SHARDS=1): run it with HA_SHARDS=1, or `scrapy-ha flush {keys.spider}` "
                "first to start it again sharded"
            )
        if wanted > 1:
            await queue.client.set(keys.shard_count, wanted, nx=True)
            stored = await queue.client.get(keys.shard_count)
        else:
            return
    have = int(stored)
    if have != wanted:
        raise ConfigError(
            f"HA_SHARDS={wanted} but the crawl of {keys.spider} is in Redis with "
            f"HA_SHARDS={have} (key {keys.shard_count}): run it with HA_SHARDS={have}, or "
            f"`scrapy-ha flush {keys.spider} --shards {have}` first to start it again"
        )


class ShardedQueue(RedisQueue):
    """RedisQueue's interface over the N shards of one crawl (see the module's docstring).

    ``keys`` and ``client`` are shard 0's: the crawl-wide keys every other part reads."""

    numbers_children = False  # see sync()

    def __init__(
        self,
        client: Any,
        keys: Keys,
        *,
        order: str = "fifo",
        start_order: str = "",
        worker: str = "",
        heartbeat_ms: int = 60000,
    ) -> None:
        super().__init__(client, keys, order=order, start_order=start_order)
        self.shards = [
            RedisQueue(client, keys.of_shard(i), order=order, start_order=start_order)
            for i in range(keys.shards)
        ]
        #: the keys under the crawl's own tag (``{<spider>}``): the start-URL feed's
        self._home = RedisQueue(client, Keys(keys.prefix, keys.spider), order=order)
        self.worker = worker
        self.heartbeat_ms = heartbeat_ms
        self._rate = 0.0  # pages/s, as the last renewal published it
        self.live_workers = 0  # at the last renewal (shard 0 holds the heartbeats)
        self._next = 0  # the shard the next round leases from first
        self._robin = itertools.count()  # placement of requests never filtered
        self._taken: dict[str, int] = {}  # worker-made entry id -> its shard
        self._known: list[tuple[int, int, int]] = [(0, 0, 0)] * keys.shards

    # -- ids and placement ----------------------------------------------------------

    def place(self, entry: NewEntry) -> int:
        """The shard of a new request."""
        n = len(self.shards)
        if entry.task:
            return task_shard(entry.task, n)
        if entry.fingerprint:
            return shard_of(entry.fingerprint, n)
        return next(self._robin) % n

    def route(self, entry_id: str) -> tuple[int, str]:
        """(shard, id within it) of an id the worker holds."""
        head, sep, tail = entry_id.partition(":")
        if sep and head.isdigit():
            return int(head), tail
        return self._taken.get(entry_id, 0), entry_id

    outside = staticmethod(outside)

    def split(self, pairs: Iterable[Pair]) -> dict[int, list[Pair]]:
        """*pairs* by shard, as each shard names them."""
        by: dict[int, list[Pair]] = {}
        for entry_id, token in pairs:
            shard, local = self.route(entry_id)
            by.setdefault(shard, []).append((local, token))
        return by

    # -- sync -----------------------------------------------------------------------

    async def sync(
        self,
        *,
        enqueue: list[NewEntry] = [],  # noqa: B006 (never mutated)
        ack: list[Pair] = [],  # noqa: B006
        lease: int = 0,
        lease_ms: int = 30000,
        promote: int = 500,
        worker: str | None = None,
        sender: Sender | None = None,
        numbers: Sequence[int] = (),
        expect: int = 0,
    ) -> SyncResult:
        """Children (each in its shard, fenced), then acks, then leases in rotation.

        *sender* (and with it *numbers* and *expect*) is not passed on: a shard skips the
        children numbered at or below the newest it stored, and a sharded round may send a
        shard its children out of their numbers' order (a child waits for its parent in
        another shard), which would skip one never stored. So a sharded round sent again
        after a lost reply may queue its ``dont_filter`` children twice, and a shard that
        fails over to a replica lacking its newest children is not detected
        (docs/reliability.md, known limits; docs/scaling.md, "Children the old primary
        confirmed")."""
        total = SyncResult(0, 0, 0, 0, 0, 0, 0)
        placed = [(self.place(e), e) for e in enqueue]
        for shard, e in placed:
            if e.taken is not None:
                self._taken[e.taken[0]] = shard
        for stage in _stages(placed, self.route):
            await self._store(stage, lease_ms, total)
        acks = self.split(ack)
        remaining = lease
        first = self._next
        for step in range(len(self.shards)):
            shard = (first + step) % len(self.shards)
            if not (acks.get(shard) or remaining > 0):
                continue
            result = await self.shards[shard].sync(
                ack=acks.get(shard, []),
                lease=max(0, remaining),
                lease_ms=lease_ms,
                promote=promote,
                worker=worker,
            )
            remaining -= len(result.leases)
            self._merge(total, shard, result)
        for entry_id in [*(i for i, _ in ack), *total.dropped]:  # not held any more
            self._taken.pop(entry_id, None)
        if lease:
            self._next = (first + 1) % len(self.shards)
        total.pending, total.leased, total.delayed = map(sum, zip(*self._known, strict=True))
        return total

    async def _store(
        self, placed: list[tuple[int, NewEntry]], lease_ms: int, total: SyncResult
    ) -> None:
        """Store *placed* requests, each in its shard (one call per shard)."""
        children = await self._fenced(placed, lease_ms, total)
        for shard, entries in sorted(children.items()):
            roots = sum(1 for e, crossed in entries if e.parent is None and not crossed)
            result = await self.shards[shard].sync(
                enqueue=[e for e, _ in entries], lease_ms=lease_ms
            )
            result.roots_seen = min(result.roots_seen, roots)  # a fenced child is no root
            self._merge(total, shard, result)

    async def _fenced(
        self, placed: list[tuple[int, NewEntry]], lease_ms: int, total: SyncResult
    ) -> dict[int, list[tuple[NewEntry, bool]]]:
        """The children by shard, each with whether it left its parent's shard (then its
        parent's lease was renewed just now; children of a lost parent are dropped)."""
        crossing = {}
        for shard, e in placed:
            if e.parent is not None and self.route(e.parent[0])[0] != shard:
                crossing[e.parent] = True
        lost = set(await self._lost(list(crossing), lease_ms)) if crossing else set()
        by: dict[int, list[tuple[NewEntry, bool]]] = {}
        for shard, e in placed:
            parent = e.parent
            crossed = False
            if parent is not None:
                home, local = self.route(parent[0])
                if parent in lost:
                    total.refused += 1
                    if e.taken is not None:
                        total.dropped.add(e.taken[0])
                    continue
                crossed = home != shard
                parent = None if crossed else (local, parent[1])
            by.setdefault(shard, []).append((replace(e, parent=parent), crossed))
        return by

    async def _lost(self, parents: list[Pair], lease_ms: int) -> list[Pair]:
        """Renew *parents* in their shards; the pairs no longer this worker's."""
        lost = []
        for shard, pairs in sorted(self.split(parents).items()):
            _, gone = await self._renew_shard(shard, pairs, (), lease_ms)
            lost += self.theirs(shard, gone, parents)
        return lost

    def theirs(self, shard: int, local: list[Pair], given: Iterable[Pair]) -> list[Pair]:
        """The pairs of *given* that *local* (pairs of *shard* as it names them) stand for:
        a worker-made id has no shard prefix."""
        by_local = {}
        for entry_id, token in given:
            home, inner = self.route(entry_id)
            if home == shard:
                by_local[inner, token] = (entry_id, token)
        return [by_local.get(pair, (self.outside(shard, pair[0]), pair[1])) for pair in local]

    def _merge(self, total: SyncResult, shard: int, result: SyncResult) -> None:
        total.now_ms = max(total.now_ms, result.now_ms)
        total.added += result.added
        total.acked += result.acked
        total.stale += result.stale
        total.refused += result.refused
        total.set_aside += result.set_aside
        total.roots_seen += result.roots_seen
        total.paused = total.paused or result.paused
        for domain, until in result.gates.items():
            total.gates[domain] = max(until, total.gates.get(domain, 0))
        total.dropped |= result.dropped
        # each shard numbers its own entries: their places do not compare across shards
        leases = result.leases
        total.leases += [replace(x, id=self.outside(shard, x.id), place=None) for x in leases]
        self._known[shard] = (result.pending, result.leased, result.delayed)

    # -- leases ---------------------------------------------------------------------

    async def renew(
        self,
        pairs: list[Pair],
        *,
        worker: str,
        lease_ms: int,
        heartbeat_ms: int,
        handed: Iterable[Pair] = (),
        rate: float = 0.0,
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

    async def _renew_shard(
        self, shard: int, pairs: list[Pair], handed: Iterable[Pair], lease_ms: int
    ) -> tuple[int, list[Pair]]:
        return await self.shards[shard].renew(
            pairs,
            worker=self.worker,
            lease_ms=lease_ms,
            heartbeat_ms=self.heartbeat_ms,
            handed=handed,
            rate=self._rate,  # only shard 0's stats are read
        )

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
    ) -> int:
        shard, local = self.route(entry_id)
        done = await self.shards[shard].retry_later(
            local, token, delay_ms, payload, priority, failure_class
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
    ) -> bool:
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

    async def finish(self, worker: str) -> bool:
        """Clear the working keys of every shard once all of them are empty and no other
        worker lives (shard 0, where the heartbeats are, is cleared last)."""
        counts = await self.counts()
        if counts.active or counts.workers:  # shard 0's heartbeats: this worker has left
            return False
        for queue in [*self.shards[1:], self.shards[0]]:
            if not await queue.finish(worker):
                return False
        return True

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

    async def set_aside_wrong_types(self) -> list[str]:
        return [m for queue in self.shards for m in await queue.set_aside_wrong_types()]

    async def leave(self, worker: str, sender: str | None = None) -> None:
        for queue in self.shards:
            await queue.leave(worker, sender)

    async def flush(self) -> None:
        for queue in [*self.shards, self._home]:
            await queue.flush()
        await self.client.delete(self.keys.shard_count)
