"""The lease-based queue of one crawl: typed wrappers of the Lua scripts.

Each state change is one script (``scrapy_ha/store/lua/*.lua``, header comments list
KEYS, ARGV and the reply), assembled with the rules it shares with the others by
``scrapy_ha.store.scripts``. Times come from the Redis server clock.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import redis

from scrapy_ha.codec.masking import masked_json
from scrapy_ha.config.scheduler import DEFAULT_DLQ_MAX_AGE_MS, DEFAULT_DLQ_MAX_ENTRIES
from scrapy_ha.store import asking, scripts
from scrapy_ha.store.bloom import ExactSet, filter_keys, seen_call
from scrapy_ha.store.buckets import delete_buckets
from scrapy_ha.store.finish import finish_one
from scrapy_ha.store.frontier import convert_old_form, flush_crawl, relink_queues, relink_types
from scrapy_ha.store.functions import LibraryScript
from scrapy_ha.store.gate_log import GateLog
from scrapy_ha.store.hosts import payload_host
from scrapy_ha.store.renew_wire import live_workers, lost_pairs, renew_args, worker_stats
from scrapy_ha.store.script_keys import (
    counts_keys,
    dead_keys,
    feed_keys,
    reclaim_keys,
    release_keys,
    requeue_keys,
    retry_keys,
    sync_keys,
)
from scrapy_ha.store.state import wrong_task_keys
from scrapy_ha.store.wire import (
    ORDERS,
    Counts,
    Finished,
    Reclaimed,
    SyncResult,
    _s,
    children_lost,
    clamp_priority,
    expect_arg,
    new_nonce,
    packed_acks,
    packed_children,
    sync_result,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from scrapy_ha.keys import Keys
    from scrapy_ha.store.bloom import Dupefilter
    from scrapy_ha.store.wire import Commit, Lease, NewEntry, Sender


class RedisQueue:
    """The queue of one crawl on one asyncio Redis client."""

    #: a sync's *sender* numbers the children, and *expect* fences a server that lost some
    numbers_children = True

    def __init__(
        self, client: Any, keys: Keys, *, order: str = "fifo", start_order: str = ""
    ) -> None:
        if order not in ORDERS or start_order not in ("", *ORDERS):
            raise ValueError(f"order={order!r} must be one of {', '.join(ORDERS)}")
        self.client = client
        self.keys = keys
        #: the live workers at the last renewal (0: none yet)
        self.live_workers = 0
        self.order = order
        #: the order of start requests in their own queue ("": they share the others')
        self.start_order = start_order
        #: the exact set, or a Bloom filter (HA_DUPEFILTER, set by sharding.make_queue)
        self.dupefilter: Dupefilter = ExactSet()
        #: the order as the scripts take it (lua/lib/frontier.lua order_flags)
        self.order_arg = f"{order} {start_order}".strip()
        #: the gates changed since the last take (:meth:`take_gates`), and their number
        self.gate_log = GateLog()
        #: FCALL of the library's function (Redis 7+), EVALSHA where functions are not run
        self._sync = LibraryScript(client, "sync")
        self._renew = scripts.Registered(client, "renew")
        self._reclaim = scripts.Registered(client, "reclaim")
        self._release = scripts.Registered(client, "release")
        self._dead = scripts.Registered(client, "dead")
        self._counts = scripts.Registered(client, "counts")
        self._feed = scripts.Registered(client, "feed")
        self._retry = scripts.Registered(client, "retry")
        self._gate = scripts.Registered(client, "gate")
        self._requeue = scripts.Registered(client, "requeue")
        self._purge = scripts.Registered(client, "purge")
        self._checkpoint = scripts.Registered(client, "checkpoint")
        self._set_aside = scripts.Registered(client, "set_aside")
        self._convert = scripts.Registered(client, "convert")

    async def sync(
        self,
        *,
        enqueue: list[NewEntry] = [],  # noqa: B006 (never mutated)
        ack: list[tuple[str, str]] = [],  # noqa: B006
        release: list[tuple[str, str]] = [],  # noqa: B006
        lease: int = 0,
        lease_ms: int = 30000,
        promote: int = 500,
        worker: str | None = None,
        sender: Sender | None = None,
        numbers: Sequence[int] = (),
        expect: int = 0,
        commits: Mapping[tuple[str, str], Commit] = {},  # noqa: B006 (never mutated)
        nonce: str | None = None,
        skip: Mapping[str, int] = {},  # noqa: B006 (never mutated)
    ) -> SyncResult:
        """Enqueue, then ack and give back (*release*), then lease: one script, one call.

        With *worker*, the leases it gives are also written to the worker's grant key, so
        that its lease keeper renews them before the worker has read this reply. Each token
        it gives starts with ``<nonce>-`` (a new one if not given): the leases of a call
        whose reply was lost are known by it in the grant. With
        *sender* (see :func:`packed_children`), children already handled by an earlier call
        whose reply was lost are skipped; with *expect* too, a server that lacks the
        sender's children up to that number refuses the whole call (:class:`ChildrenLost`).
        A page's *commits* (items, checkpoint) go with its ack, under its lease. The lease
        passes over the queues of the hosts in *skip* up to the priority given (lib/frontier).
        """
        k = self.keys
        args: list[Any] = [
            len(enqueue),
            len(ack),
            lease,
            lease_ms,
            promote,
            nonce or new_nonce(),
            self.order_arg,
            expect_arg(sender, expect),
            len(release),
        ]
        args += packed_children(enqueue, sender, numbers, self.dupefilter.wire)
        keys = sync_keys(k, self.dupefilter.key(k), worker)
        acks, more = packed_acks(ack, commits, _task_keys(k), len(keys) + 1)
        since, skipped = self.gate_log.number, " ".join(f"{h}={top}" for h, top in skip.items())
        args += [*acks, *(f"{entry_id} {token}" for entry_id, token in release), skipped, since]
        try:
            reply = await seen_call(
                self._sync,
                self.dupefilter,
                k,
                call_keys=[*keys, *more],
                args=args,
                new=len(enqueue),
            )
        except redis.exceptions.ResponseError as exc:
            if lost := children_lost(exc):
                raise lost from exc
            raise
        result = sync_result(reply)
        self.gate_log.note(since, result)
        return result

    def take_gates(self) -> tuple[dict[str, float], bool]:
        """The gates closed now that the syncs since the last take learnt (domain ->
        ``time.monotonic()`` it opens), and whether they are every gate (:class:`GateLog`)."""
        return self.gate_log.take()

    async def enqueue(self, entries: list[NewEntry]) -> int:
        """Add requests (dupefilter applied); return how many were added."""
        return (await self.sync(enqueue=entries)).added

    async def lease(self, n: int, lease_ms: int) -> list[Lease]:
        """Lease up to *n* pending entries (due delayed ones are promoted first)."""
        return (await self.sync(lease=n, lease_ms=lease_ms)).leases

    async def ack(self, pairs: list[tuple[str, str]]) -> tuple[int, int]:
        """Finish leases; return (acked, stale)."""
        result = await self.sync(ack=pairs)
        return result.acked, result.stale

    async def renew(
        self,
        pairs: list[tuple[str, str]],
        *,
        worker: str,
        lease_ms: int,
        heartbeat_ms: int,
        handed: Iterable[tuple[str, str]] = (),
        rate: float | None = None,
    ) -> tuple[int, list[tuple[str, str]]]:
        """Heartbeat and renew all given leases, publish the worker's stats (leases held,
        *rate* in pages/s); return (renewed, lost (id, token) pairs).

        The *handed* leases (also renewed) are marked as handed to the engine: only the
        expiry of a lease so marked counts toward poison."""
        k = self.keys
        args = renew_args(
            pairs,
            handed,
            worker=worker,
            lease_ms=lease_ms,
            heartbeat_ms=heartbeat_ms,
            stats=worker_stats(len(pairs), rate),
        )
        reply = await self._renew(keys=k.renew_keys(), args=args)
        self.live_workers = live_workers(reply)
        return int(reply[1]), lost_pairs(reply)

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
        """Reclaim expired leases; None if another worker reclaims this interval.

        Returns (reclaimed to pending, ids dead-lettered as poison, entries set aside as
        corrupt); the dead-letter retention (*max_entries*, *max_age_ms*) applies.
        """
        keys = reclaim_keys(self.keys)
        args = [worker, interval_ms, batch, max_expiries, max_entries, max_age_ms, self.order_arg]
        reply = await self._reclaim(keys=keys, args=args)
        if int(reply[0]) < 0:
            return None
        return Reclaimed(int(reply[1]), [_s(x) for x in reply[3:]], int(reply[2]), int(reply[0]))

    async def release(self, pairs: list[tuple[str, str]]) -> int:
        """Give leases back to pending at once; return how many were released."""
        if not pairs:
            return 0
        args = [self.order_arg] + [x for pair in pairs for x in pair]
        return int(await self._release(keys=release_keys(self.keys), args=args))

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
        """Move a leased entry to the dead-letter queue (optionally with a new payload).
        The record *info* is stored masked (its reason and history are for people to read,
        never needed to redo the request).

        Returns the size of the dead-letter queue, or 0 if the lease is stale.
        """
        args = [
            entry_id,
            token,
            masked_json(info),
            max_entries,
            max_age_ms,
            payload,
            self.order_arg,
        ]
        done, size = await self._dead(keys=dead_keys(self.keys), args=args)
        return int(size) if int(done) else 0

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
        """Move a leased entry to the delayed set; return its due time, 0 if the lease is stale.
        With *priority* (the retried request's), the entry is promoted with that priority and
        its place in the order; without, with its original score. With *failure_class* it is
        a retry, counted (``retried:<class>``); without, a deferral that cost no attempt,
        marked as waiting for *held* (``gate``, ``proxy`` or ``dictionary``: lib/held)."""
        prio = "" if priority is None else clamp_priority(priority)
        args = [entry_id, token, delay_ms, payload, prio, failure_class, self.order_arg, held]
        return int(await self._retry(keys=retry_keys(self.keys), args=args))

    async def close_gate(self, domain: str, ms: int) -> int:
        """Close *domain* for every worker for *ms*; return when it opens (server ms)."""
        keys = [self.keys.gates, self.keys.gate_log]
        return int(await self._gate(keys=keys, args=[domain, ms]))

    async def requeue_dead(self, entries: list[tuple[str, int, bytes]]) -> int:
        """Move (id, priority, payload) dead-letter entries back to pending, each to the back
        queue of its URL's host; return how many."""
        if not entries:
            return 0
        args: list[Any] = [self.order]
        for entry_id, priority, payload in entries:
            args += [entry_id, priority, payload_host(payload), payload]
        return int(await self._requeue(keys=requeue_keys(self.keys), args=args))

    async def purge_dead(self, ids: list[str]) -> tuple[int, int]:
        """Delete dead-letter entries for good; return (deleted, kept because an SQL archive
        is declared for the crawl and they are not archived yet)."""
        if not ids:
            return 0, 0
        k = self.keys
        keys = [k.dead, k.dead_info, k.payload, *k.stats_keys(), k.dead_archived]
        deleted, kept = await self._purge(keys=[*keys, k.revisit_urls], args=ids)
        return int(deleted), int(kept)

    async def counts(self) -> Counts:
        """Size of every state, read atomically."""
        return Counts.from_reply(await self._counts(keys=counts_keys(self.keys)))

    async def finish(self, worker: str, *, keep: bool = False) -> Finished:
        """End a finished crawl if no other worker is alive (see :mod:`.finish`)."""
        return await finish_one(self, worker, keep=keep)

    async def granted(self, worker: str) -> dict[bytes, bytes]:
        """The leases the last sync of *worker* granted (the grant key: id -> token; its
        field ``=``, the nonce of the call that wrote it, left out)."""
        grant = await self.client.hgetall(self.keys.grant(worker))
        grant.pop(b"=", None)
        return dict(grant)

    async def exists(self) -> bool:
        """Whether any key of the crawl but its checkpoints is in Redis."""
        return await asking.exists_any(self.client, self.keys.all())

    async def feed(
        self, key: str, *, as_set: bool, raw: list[bytes], entries: list[NewEntry]
    ) -> int:
        """Move *raw* start URL entries out of *key* and enqueue *entries* (one per raw entry).

        Returns how many were added, or -1 if another worker took the list's head first.
        """
        k = self.keys
        args: list[Any] = ["set" if as_set else "list", len(raw), self.order, *raw]
        for e in entries:
            host = e.host or payload_host(e.payload)
            args += [
                self.dupefilter.wire(e.fingerprint),
                clamp_priority(e.priority),
                host,
                e.payload,
            ]
        keys = feed_keys(k, key, self.dupefilter.key(k))
        new = len(entries)
        return int(
            await seen_call(self._feed, self.dupefilter, k, call_keys=keys, args=args, new=new)
        )

    async def save_checkpoint(
        self, entry_id: str, token: str, task: str, doc: bytes, ttl_ms: int
    ) -> int:
        """Save a task's checkpoint if the page's lease is current: 1 saved (or kept aside),
        0 the lease is stale, 2 the page is behind the task's checkpoint (not saved)."""
        keys = [self.keys.leases, self.keys.checkpoint(task), self.keys.checkpoint_ahead(task)]
        return int(await self._checkpoint(keys=keys, args=[entry_id, token, doc, ttl_ms]))

    async def set_aside_wrong_types(self, error: str = "") -> list[str]:
        """Rename every key of the crawl whose type is wrong to ``<key>:corrupt:<seconds>``,
        in one script (workers that find the same key at once rename it once), and the task
        keys (checkpoints) that the WRONGTYPE *error* names; relink the back queues (see
        :func:`.relink_queues`). Returns the keys set aside (garbage must not stop a crawl)."""
        # the dupefilter's extra keys are a Bloom filter's bitmaps (strings), or keys the
        # crawl's table types (the time slices' hash and sets, the buckets' meta hash)
        types = dict.fromkeys(self.dupefilter.extra_keys(self.keys), "string") | self.keys.types()
        types |= wrong_task_keys(self.keys, error) | relink_types(self.keys)
        reply = await self._set_aside(keys=list(types), args=list(types.values()))
        pairs = [(_s(reply[i]), _s(reply[i + 1])) for i in range(0, len(reply), 2)]
        await relink_queues(self.client, self.keys, [key for key, _ in pairs])
        return [f"{key} ({actual}, expected {types[key].rstrip('!')})" for key, actual in pairs]

    async def leave(self, worker: str, sender: str | None = None) -> None:
        """Unregister a worker that stops (and forget its *sender* nonce's number: every
        call of it has had its reply)."""
        pipe = self.client.pipeline(transaction=False)  # one round trip, not four
        pipe.zrem(self.keys.workers, worker)
        pipe.hdel(self.keys.worker_stats, worker)
        if sender is not None:
            pipe.hdel(self.keys.sent, sender)
            pipe.hdel(self.keys.senders, worker)
        await pipe.execute()

    async def upgrade(self) -> int:
        """Convert requests stored pending by a version before the back queues (see
        :func:`~scrapy_ha.store.frontier.convert_old_form`); return how many."""
        return await convert_old_form(self._convert, self.keys, self.order_arg)

    async def flush(self) -> None:
        """Delete every key of the crawl, dead-letter queue and back queues included."""
        filters = await filter_keys(self.client, self.keys)
        await flush_crawl(self.client, self.keys)
        await self.client.unlink(*self.keys.crawl_keys(), *filters)
        await delete_buckets(self.client, None, self.keys, every=True)


def _task_keys(keys: Keys) -> Callable[[str], tuple[str, str]]:
    """A task's checkpoint and ahead hash in *keys*' crawl (an ack that saves it names both)."""
    return lambda task: (keys.checkpoint(task), keys.checkpoint_ahead(task))
