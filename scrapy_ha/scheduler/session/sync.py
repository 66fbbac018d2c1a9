"""One sync with Redis: the outbox sent in its order, more requests leased, and what came
back handed to the shell.

The sync script (``lua/sync.lua``) takes the children first (in batches, each before the
checkpoints and acks that depend on it), then the acks and the lease of more requests in
one call; its reply says which new requests Redis stored or refused, and brings the
leased ones, which go to the shell's buffer (:meth:`Shell.take`), or, unreadable, to the
dead-letter path of :mod:`.ends`.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from redis.exceptions import ResponseError

from scrapy_ha.codec import CodecError, decode_request
from scrapy_ha.scheduler.outbox import BATCH, batch_end, latest_saves
from scrapy_ha.scheduler.session.durable import Durability
from scrapy_ha.scheduler.session.ends import kept
from scrapy_ha.scheduler.session.lost import fenced_sync
from scrapy_ha.store.dictionary import Dictionaries
from scrapy_ha.store.items import ItemStream
from scrapy_ha.store.shards import ShardedQueue
from scrapy_ha.store.wire import new_nonce

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from scrapy.statscollectors import StatsCollector

    from scrapy_ha.codec.compact import Dictionary
    from scrapy_ha.config.scheduler import SchedulerConfig
    from scrapy_ha.scheduler.outbox import Pair
    from scrapy_ha.scheduler.remote import Remote
    from scrapy_ha.scheduler.session.connect import StartReport
    from scrapy_ha.scheduler.session.ends import Ends
    from scrapy_ha.scheduler.session.keeper import LeaseKeeper
    from scrapy_ha.scheduler.session.renewal import Renewals
    from scrapy_ha.scheduler.session.shell import Shell
    from scrapy_ha.store.queue import RedisQueue
    from scrapy_ha.store.wire import Lease, NewEntry, SyncResult

__all__ = ["Syncer"]

logger = logging.getLogger(__name__)
#: What the checkpoint script's status says (1, the rest: saved, or kept aside), as a stat.
SAVE_STATUS = {0: "stale", 2: "behind"}


class Syncer:
    """Syncs one shell's outbox with Redis (the session decides when)."""

    def __init__(
        self,
        shell: Shell,
        *,
        ends: Ends,
        renewals: Renewals,
        remote: Remote,
        starts: StartReport,
        held_pairs: Callable[[], tuple[Pair, ...]],
        redis_url: str,
    ) -> None:
        self.shell = shell
        self.outbox = shell.outbox
        self.stats: StatsCollector = shell.stats
        self.ends = ends
        self.renewals = renewals
        self.remote = remote
        self.starts = starts
        self._held_pairs = held_pairs
        self.redis_url = redis_url
        #: the crawl's compaction dictionaries, once connected
        self.dictionaries: Dictionaries | None = None
        #: whether this worker's grant may name leases it never took (a call that named the
        #: worker ended before its reply was read and its leases taken): then the next call
        #: (:meth:`give_back_unread`) or the close (:meth:`never_taken`) reads the grant and
        #: releases them. Cleared once a call's reply is read and its leases taken (sync.lua
        #: wrote the grant anew with them, or left it as it was), or by that release; never
        #: in a sharded crawl, whose call may skip the shards whose grant is older.
        self.grant_unread = False
        #: the nonce of the latest call that named this worker (not sharded): the tokens of
        #: the leases it gave start with it, and only those are given back (another process
        #: given the same HA_WORKER_ID writes the same grant key)
        self._unread_call: str | None = None
        #: how long the roots this worker stored must be kept (RDB snapshots alone)
        self.durability = Durability(self.outbox.retained)

    @property
    def queue(self) -> RedisQueue | None:
        return self.ends.queue

    @property
    def config(self) -> SchedulerConfig:
        return self.shell.config

    async def sync(self, *, lease: int, more: bool = False) -> bool:
        """Send the outbox in its order (see :data:`scrapy_ha.scheduler.outbox.SEND_ORDER`), then
        lease *lease* more (with *more*, as many as the shell wants once the new requests
        are sealed: one that came meanwhile may outrank the buffer and must come back).

        The acks and ends taken here were collected after their children were queued, so
        every child goes to Redis (in earlier batches if need be) before its parent's ack.
        True if the buffer was empty and this sync filled it: new work for the engine.
        """
        assert self.queue is not None
        box = self.outbox
        lease_ms = int(self.config.lease_time * 1000)
        await self.give_back_unread()
        if box.loose_items:
            await self._add_loose()
        n_acks, n_ends = len(box.acks), len(box.ends)
        while box.children and (batch_end(box.children) < len(box.children) or box.checkpoints):
            await self.shell.handout.offer()  # then no await until seal: none slips past
            batch = box.children[: batch_end(box.children)]
            self.shell.handout.seal(batch, keep=False)  # kept only where a grant covers them
            result = await self._call_sync(enqueue=batch, lease_ms=lease_ms)
            self._sent(result, batch)
        if box.checkpoints:
            await self.save_checkpoints()
        await self.shell.handout.offer()
        enqueue = box.children[:]
        kept = self.shell.handout.seal(enqueue)
        if more:
            # kept requests fill the buffer: what it wanted before may be too many now
            lease = self.shell.want() if kept else max(lease, self.shell.want())
        if self.remote.held:
            lease = 0  # Redis's memory is high: nothing new (see .pressure)
        # the grant (renewed before the reply is read, released at close if it is never
        # read) holds what this call leases: pending requests, and the kept new ones
        keeper = self.renewals.keeper if lease or any(e.kept for e in enqueue) else None
        # the buffered requests that kept ones crowded out go back in the call that stores
        # those: Redis never holds both (see scrapy_ha.scheduler.keep)
        release, box.releases = box.releases, []
        skip = self.shell.precedence.blocked.skip  # (see scrapy_ha.scheduler.blocked)
        started = time.monotonic()
        named = self._naming(keeper)
        try:
            result = await self._call_sync(
                enqueue=enqueue,
                ack=box.acks[:n_acks],
                release=release,
                commits=box.commits,
                lease=lease,
                lease_ms=lease_ms,
                promote=BATCH,
                worker=self.config.worker_id if keeper is not None else None,
                skip=skip,
                **named,
            )
            self.shell.precedence.blocked.synced(skip, result.head)  # (before remote.synced)
            self._committed(box.acks[:n_acks], result)
            del box.acks[:n_acks]
            box.retained.prune(self._held_pairs)
            self._sent(result, enqueue)
            self._note_server(result)
            was_empty = not self.shell.buffered()
            await self._take_all(result.leases)
            if not isinstance(self.queue, ShardedQueue):
                # the grant holds this call's leases, all taken, or (a paused crawl's call,
                # or one that named no worker) is as it was, its unread leases given back
                self.grant_unread = False
            if was_empty and result.leases:  # only new leases buffered: valid from the call
                renewals = self.renewals
                renewals.valid_until = max(renewals.valid_until, started + self.config.lease_time)
        except BaseException:
            box.releases[:0] = release  # renewed meanwhile, given back by a later round
            raise
        finally:
            if keeper is not None:
                keeper.hold(self._held_pairs())
                keeper.syncing(False)
        await self.ends.settle_corrupt()
        await self.ends.end_ops(box.ends, n_ends)
        self.renewals.acked += self.ends.visits  # (revisits: pages done, not acked)
        self.ends.visits = 0
        self.remote.synced(result, asked=bool(lease))
        await self.durability.look(self.queue.client, box.retained)  # (for the next prune)
        # new work for the engine: a buffer that was empty, or held only what waits for a
        # full download slot (the engine looks at it again only as downloads end)
        return (was_empty or bool(skip and result.leases)) and bool(self.shell.buffered())

    async def send_gates(self) -> None:
        """Close the domains this worker was told to close for every worker (a 429)."""
        assert self.queue is not None
        gates = self.outbox.gates
        for domain, seconds in list(gates.items()):
            await self.queue.close_gate(domain, int(seconds * 1000))
            if gates.get(domain) == seconds:  # (a longer close made meanwhile goes next)
                del gates[domain]
            logger.info(
                "Domain %s closed for %.1f s for every worker (rate limited)", domain, seconds
            )

    def _naming(self, keeper: LeaseKeeper | None) -> dict[str, str]:
        """Before a call that names this worker (*keeper* set): the keeper renews its leases
        even before the reply is read, and its grant counts as unread until then; the call's
        nonce, where the grant may be read before the close (not sharded)."""
        if keeper is None:
            return {}
        keeper.syncing(True)
        self.grant_unread = True
        if isinstance(self.queue, ShardedQueue):
            return {}
        self._unread_call = new_nonce()
        return {"nonce": self._unread_call}

    async def give_back_unread(self) -> None:
        """After a call that named this worker and whose reply never came (the connection
        reset after Redis ran it): the leases the grant names that this worker does not
        have go back to pending at once. Else they wait out their lease: the next call that
        names the worker writes the grant anew. Done before any other call (the grant
        holds the lost call's leases still); in a sharded crawl the close does it."""
        if not self.grant_unread or isinstance(self.queue, ShardedQueue):
            return
        assert self.queue is not None
        granted = await self._lost_calls_leases()
        # what the worker has: buffered, in flight (stored or not), to end, kept to send
        mine = {*self.shell.inflight.pairs(), *self._held_pairs()}
        mine.update(e.taken for e in self.outbox.children if e.taken)
        released = await self.queue.release([pair for pair in granted if pair not in mine])
        self.grant_unread = False
        if released:
            self.stats.inc_value("ha/released", released)
            logger.info("Released %d lease(s) of a round whose reply was lost", released)

    async def never_taken(self, held: list[Pair]) -> list[Pair]:
        """At close: the leases the grant names that are not *held*, if a call that wrote it
        may have left it unread (a sharded crawl's call may skip the shards whose grant is
        older: there it is always read)."""
        if not self.grant_unread:  # else every lease the grant names was taken: no read
            return []
        return sorted(set(await self._lost_calls_leases()) - set(held))

    async def _lost_calls_leases(self) -> list[Pair]:
        """The leases the grant names, of the latest call that named this worker where its
        nonce is known (not sharded), else all."""
        assert self.queue is not None
        granted = await self.renewals.unread_grant(self.queue, self.config.worker_id)
        if self._unread_call is None or isinstance(self.queue, ShardedQueue):
            return granted
        mark = self._unread_call + "-"
        return [pair for pair in granted if pair[1].startswith(mark)]

    async def read_dictionaries(self) -> Dictionary | None:
        """Read the crawl's compaction dictionaries (once connected); return the one new
        requests are compacted with (None: none yet)."""
        assert self.queue is not None
        self.dictionaries = Dictionaries(self.queue.client, self.queue.keys, worker=True)
        return await self.dictionaries.load()

    async def _take_all(self, leases: list[Lease]) -> None:
        """Track the leases of a reply (renewed, released from here on), the dictionary of a
        compacted one read first (once per dictionary)."""
        if self.dictionaries is not None:
            await self.dictionaries.ensure(lease.payload for lease in leases)
        for lease in leases:
            self._take(lease)

    async def _call_sync(self, **call: Any) -> SyncResult:
        """The sync script, fenced against a Redis that lost children (see :mod:`.lost`)."""
        assert self.queue is not None
        held, url, known = self._held_pairs, self.redis_url, self.dictionaries
        return await fenced_sync(
            self.queue,
            self.outbox,
            held=held,
            stats=self.stats,
            redis_url=url,
            dictionaries=known,
            **call,
        )

    def _sent(self, result: SyncResult, sent: list[NewEntry]) -> None:
        """Redis has *sent*, the head of the outbox's children: forget them, and tell the
        shell the fate of those it handed out already."""
        self.outbox.children_stored(len(sent))
        self.shell.handout.settle(sent, result.dropped)
        self._count(result, sent)
        if result.released:  # (a children-only call too: a sharded crawl's unread leases)
            self.stats.inc_value("ha/released", result.released)
        keeper = self.renewals.keeper
        if keeper is not None and any(entry.taken for entry in sent):
            # its new requests are leased to it now: the keeper renews them (loop blocked or not)
            keeper.hold(self._held_pairs())

    def _count(self, result: SyncResult, sent: list[NewEntry]) -> None:
        self.ends.count(result, len(sent))
        self.renewals.acked += result.acked
        self.shell.admission.forget_refused(sent, result)
        self.starts.count(result, sent)

    def _committed(self, acked: list[Pair], result: SyncResult) -> None:
        """Count what the acked pages committed (their items, their checkpoints), and what
        a stale ack refused: another worker has that page and commits its own run's."""
        commits = [c for pair in acked if (c := self.outbox.commits.pop(pair, None))]
        if not commits:
            return
        inc = self.stats.inc_value
        sent, saves = sum(len(c.items) for c in commits), sum(1 for c in commits if c.checkpoint)
        if result.items:
            inc("ha/items/committed", result.items)
        if result.checkpoints:
            inc("ha/checkpoint/saved", result.checkpoints)
        if sent > result.items:
            inc("ha/items/refused", sent - result.items)
            logger.warning(
                "%d item(s) not committed: the lease of their page had expired (another "
                "worker redoes the page and commits its own)",
                sent - result.items,
            )
        if saves > result.checkpoints:
            inc("ha/checkpoint/stale", saves - result.checkpoints)

    async def _add_loose(self) -> None:
        """Items no page yielded go to the stream on their own (no lease fences them)."""
        assert self.queue is not None
        box = self.outbox
        items = box.loose_items[:]
        stream = ItemStream(self.queue.client, self.queue.keys)
        added = await stream.add(items, (box.nonce, box.loose_sent + 1))
        del box.loose_items[: len(items)]
        box.loose_sent += len(items)
        self.stats.inc_value("ha/items/committed", added)

    def _take(self, lease: Lease) -> None:
        """Hand a leased request to the shell; an unreadable one waits in ``ends.corrupt``
        (still renewed) until it is dead-lettered."""
        try:
            if not lease.payload:
                raise CodecError("the payload is missing")
            payload = lease.payload
            if self.dictionaries is not None:
                payload = self.dictionaries.expand(payload)
            request = decode_request(payload, self.ends.spider, schemes=self.config.allowed_schemes)
        except Exception as exc:  # any failure to rebuild it is this entry's alone
            known = self.dictionaries
            waits = known is not None and known.waits_for(lease.payload)
            self.ends.unreadable(lease, exc, waits=waits)
            return
        self.shell.take(request, lease)

    async def save_checkpoints(self) -> None:
        """After the children, before the acks: a checkpoint never runs ahead of the queue."""
        assert self.queue is not None
        saves = self.outbox.checkpoints
        if superseded := latest_saves(saves):
            self.stats.inc_value("ha/checkpoint/superseded", superseded)
        # those queued before the children just sent: one queued during an await below may
        # follow children of its page not sent yet, and waits for the next round (a review)
        for _ in range(len(saves)):
            if not saves:
                break
            cp = saves[0]
            try:
                saved = await self.queue.save_checkpoint(
                    cp.entry_id, cp.token, cp.task, cp.doc, cp.ttl_ms
                )
            except ResponseError as exc:
                if kept(exc):  # a key set aside first (WRONGTYPE), memory: sent again
                    raise
                saves.pop(0)  # refused as it is: sent again, refused again, for ever
                self.stats.inc_value("ha/checkpoint/failed")
                logger.error("Checkpoint of task %s refused by Redis (%s): dropped", cp.task, exc)
                continue
            saves.pop(0)
            self.stats.inc_value(f"ha/checkpoint/{SAVE_STATUS.get(saved, 'saved')}")
            if not saved:
                logger.warning(
                    "Checkpoint of task %s refused: this worker's lease on the page "
                    "expired (another worker has it)",
                    cp.task,
                )

    def _note_server(self, result: SyncResult) -> None:
        self.remote.clock(result)
        assert self.queue is not None
        news, every = self.queue.take_gates()
        if news or every:
            self.shell.set_gates(news, every=every)
