"""A sharded crawl's ids, placement and sync: where a new request goes, how the worker names
an entry of a shard, and one sync across the shards (children in stages, each fenced by its
parent's lease; acks; leases in rotation). See :mod:`scrapy_ha.store.shards` for the scheme;
:class:`~scrapy_ha.store.shards.ShardedQueue` adds the rest of the queue's interface."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from scrapy_ha.keys import Keys, shard_of, task_shard
from scrapy_ha.store.gate_log import OPEN
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry, SyncResult

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

    from scrapy_ha.store.wire import Commit, Sender

__all__ = ["Pair", "ShardedSync", "outside"]

Pair = tuple[str, str]

#: Seconds between two scans of the gates known for those every shard says are open (a
#: scan per round cost 21 ms at 50,000 gates, a review).
SWEEP_S = 1.0
#: The parent a child stored in another shard than its page's is sent with: its page's
#: lease was renewed in the page's shard just now, so none is fenced here, but it is no
#: start request (a duplicate counts as filtered, sync.lua).
LINKED = ("+", "")


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


class ShardedSync(RedisQueue):
    """The shards of one crawl, their ids and placement, and the sync across them.

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
        #: every shard the crawl's keys are on: the first ``keys.shards`` take new requests
        self.shards = [
            RedisQueue(client, shard, order=order, start_order=start_order)
            for shard in keys.every_shard()
        ]
        #: the keys under the crawl's own tag (``{<spider>}``): the start-URL feed's
        self._home = RedisQueue(client, Keys(keys.prefix, keys.spider), order=order)
        self.worker = worker
        self.heartbeat_ms = heartbeat_ms
        self._rate: float | None = None  # pages/s, as the last renewal published it
        #: domain -> shard -> its last word on the domain's gate (when it opens)
        self._gate_words: dict[str, dict[int, float]] = {}
        self._gates_swept = 0.0
        self.live_workers = 0  # at the last renewal (shard 0 holds the heartbeats)
        self._next = 0  # the shard the next round leases from first
        self._robin = itertools.count()  # placement of requests never filtered
        self._taken: dict[str, int] = {}  # worker-made entry id -> its shard
        self._known: list[tuple[int, int, int]] = [(0, 0, 0)] * len(self.shards)
        #: of rounds that failed at a later shard (the caller sends them again whole): each
        #: earlier shard call's acks with what it said of them, and the leases they granted,
        #: which nobody read
        self._taken_before: list[_Taken] = []
        self._unread: list[Pair] = []

    # -- ids and placement ----------------------------------------------------------

    def place(self, entry: NewEntry) -> int:
        """The shard of a new request (one of the first ``keys.shards``)."""
        n = self.keys.shards
        if entry.task:
            return task_shard(entry.task, n)
        if entry.fingerprint:
            return shard_of(entry.fingerprint, n)
        return next(self._robin) % n

    def route(self, entry_id: str) -> tuple[int, str]:
        """(shard, id within it) of an id the worker holds."""
        head, sep, tail = entry_id.partition(":")
        if sep and head.isascii() and head.isdecimal():  # "²" is a digit int() refuses
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
        release: list[Pair] = [],  # noqa: B006
        lease: int = 0,
        lease_ms: int = 30000,
        promote: int = 500,
        worker: str | None = None,
        sender: Sender | None = None,
        numbers: Sequence[int] = (),
        expect: int = 0,
        commits: Mapping[Pair, Commit] = {},  # noqa: B006 (never mutated)
        nonce: str | None = None,  # noqa: ARG002 (each shard's call makes its own)
        skip: Mapping[str, int] = {},  # noqa: B006 (never mutated)
    ) -> SyncResult:
        """Children (each in its shard, fenced), then acks (with what their pages commit:
        a page's items go to its shard's stream) and leases given back (*release*) with
        leases in rotation, each shard's in one call.

        *sender* (and with it *numbers* and *expect*) is not passed on: a shard skips the
        children numbered at or below the newest it stored, and a sharded round may send a
        shard its children out of their numbers' order (a child waits for its parent in
        another shard), which would skip one never stored. So a sharded round sent again
        after a lost reply may queue its ``dont_filter`` children twice, and a shard that
        fails over to a replica lacking its newest children is not detected
        (docs/reliability.md, known limits; docs/scaling.md, "Children the old primary
        confirmed").

        A round that fails at a shard after others went through is sent again whole: the
        acks those shards took are counted then, not sent twice, and the leases they
        granted, never read, are given back by the next round that goes through."""
        total = SyncResult(0, 0, 0, 0, 0, 0, 0)
        placed = [(self.place(e), e) for e in enqueue]
        for shard, e in placed:
            if e.taken is not None:
                self._taken[e.taken[0]] = shard
        for stage in _stages(placed, self.route):
            await self._store(stage, lease_ms, total)
        gives_back = self._unread
        told = set(ack)
        # taken by a round that failed after: counted now as their shard counted them
        before = [t for t in self._taken_before if t.pairs <= told]
        skipped = set().union(*(t.pairs for t in before))
        to_ack = [pair for pair in ack if pair not in skipped]
        for taken in before:
            taken.count(total)
        new: list[_Taken] = []
        acks, backs = self.split(to_ack), self.split([*release, *gives_back])
        own: dict[int, list[Pair]] = {}  # to_ack by shard, as the caller names them
        for pair in to_ack:
            own.setdefault(self.route(pair[0])[0], []).append(pair)
        shard_commits = self._split_commits(to_ack, commits)
        remaining = lease
        first = self._next
        part = SyncResult(0, 0, 0, 0, 0, 0, 0)  # what the acks' and leases' calls did
        try:
            for step in range(len(self.shards)):
                shard = (first + step) % len(self.shards)
                if not (acks.get(shard) or backs.get(shard) or remaining > 0):
                    continue
                result = await self.shards[shard].sync(
                    ack=acks.get(shard, []),
                    release=backs.get(shard, []),
                    commits=shard_commits.get(shard, {}),
                    lease=max(0, remaining),
                    lease_ms=lease_ms,
                    promote=promote,
                    worker=worker,
                    skip=skip,
                )
                remaining -= len(result.leases)
                self._merge(part, shard, result)
                if own.get(shard):
                    new.append(_Taken.of(own[shard], result))
        except BaseException:
            # the round is sent again: what shards took is not (see _Taken), and what they
            # leased, never read, is given back by the next round that goes through
            self._taken_before += new
            self._unread = [*gives_back, *((x.id, x.token) for x in part.leases)]
            raise
        self._unread = []
        # told: the caller sends them no more
        self._taken_before = [t for t in self._taken_before if not t.pairs <= told]
        _add_counts(total, part)
        total.leases += part.leases
        gone = [*(i for i, _ in ack), *(i for i, _ in release), *total.dropped]
        for entry_id in gone:  # not held any more
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
            roots = sum(1 for e, _ in entries if e.parent is None)
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
                parent = LINKED if crossed else (local, parent[1])
            by.setdefault(shard, []).append((replace(e, parent=parent), crossed))
        return by

    async def _lost(self, parents: list[Pair], lease_ms: int) -> list[Pair]:
        """Renew *parents* in their shards; the pairs no longer this worker's."""
        lost = []
        for shard, pairs in sorted(self.split(parents).items()):
            _, gone = await self._renew_shard(shard, pairs, (), lease_ms)
            lost += self.theirs(shard, gone, parents)
        return lost

    def _split_commits(
        self, ack: list[Pair], commits: Mapping[Pair, Commit]
    ) -> dict[int, dict[Pair, Commit]]:
        """The commits of *ack* by shard, each keyed as its shard names the lease (a page's
        task's checkpoint keys are in the page's shard: its task's)."""
        by: dict[int, dict[Pair, Commit]] = {}
        for pair in ack:
            if (commit := commits.get(pair)) is not None:
                shard, local = self.route(pair[0])
                by.setdefault(shard, {})[local, pair[1]] = commit
        return by

    def theirs(self, shard: int, local: list[Pair], given: Iterable[Pair]) -> list[Pair]:
        """The pairs of *given* that *local* (pairs of *shard* as it names them) stand for:
        a worker-made id has no shard prefix."""
        by_local = {}
        for entry_id, token in given:
            home, inner = self.route(entry_id)
            if home == shard:
                by_local[inner, token] = (entry_id, token)
        return [by_local.get(pair, (self.outside(shard, pair[0]), pair[1])) for pair in local]

    def take_gates(self) -> tuple[dict[str, float], bool]:
        """Every shard's gates learnt since the last take (a gate is closed in every shard,
        shards.close_gate), each domain's the latest of every shard's last word on it: a
        shard whose gate is shorter than another's (a close that reached one shard only, a
        failover to an older copy) does not shorten the worker's copy. An operator's open
        (OPEN, gate_open.lua: every shard) opens it at the first shard that says so: a
        round may call one shard only. A shard that lost its log does not make the worker
        forget the others' gates: every shard is asked for all of its gates again
        instead."""
        words, now = self._gate_words, time.monotonic()
        gates: dict[str, float] = {}
        lost = False
        for i, queue in enumerate(self.shards):
            news, every = queue.take_gates()
            lost = lost or every
            for domain, until in news.items():
                if until == OPEN:
                    words.pop(domain, None)
                    gates[domain] = OPEN
                else:
                    said = words.setdefault(domain, {})
                    said[i] = until
                    gates[domain] = max(said.values())
        if now >= self._gates_swept + SWEEP_S:  # (once a second: a scan of every gate known)
            self._gates_swept = now
            for domain in [d for d, said in words.items() if max(said.values()) <= now]:
                del words[domain]  # open in every shard
        if lost:  # every shard's gates read again (the words kept: none is shortened)
            for queue in self.shards:
                queue.gate_log.number = 0
        return gates, False

    def _merge(self, total: SyncResult, shard: int, result: SyncResult) -> None:
        _add_counts(total, result)
        # each shard numbers its own entries: their places do not compare across shards
        leases = result.leases
        total.leases += [replace(x, id=self.outside(shard, x.id), place=None) for x in leases]
        self._known[shard] = (result.pending, result.leased, result.delayed)

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


def _add_counts(total: SyncResult, result: SyncResult) -> None:
    """Add what *result* counts to *total* (not its leases)."""
    total.now_ms = max(total.now_ms, result.now_ms)
    total.added += result.added
    total.acked += result.acked
    total.released += result.released
    total.stale += result.stale
    total.refused += result.refused
    total.set_aside += result.set_aside
    # (total.now_ms is the latest call's: each shard's call set its entries aside at its own)
    for ms in result.set_aside_at or ([result.now_ms] if result.set_aside else []):
        if ms not in total.set_aside_at:
            total.set_aside_at.append(ms)
    total.roots_seen += result.roots_seen
    total.items += result.items
    total.checkpoints += result.checkpoints
    total.paused = total.paused or result.paused
    for domain, until in result.gates.items():
        total.gates[domain] = max(until, total.gates.get(domain, 0))
    total.dropped |= result.dropped


@dataclass(frozen=True)
class _Taken:
    """The acks one shard call took, as the caller names them, and what the shard said of
    them, in a round that failed at a later shard. Sent again, each came back stale
    ("their leases had expired and were reclaimed", which they had not: a QA run of a
    cluster failover) and its page's items were warned of as not committed; so the round
    sent again counts them as their shard did the first time, and does not send them.
    Whole: a reply counts its acks and its stale ones, not which were which."""

    pairs: frozenset[Pair]
    acked: int
    stale: int
    items: int
    checkpoints: int

    @classmethod
    def of(cls, pairs: list[Pair], result: SyncResult) -> _Taken:
        # (a shard call of the acks' loop stores nothing: its items and checkpoints are
        # those of its acks' commits)
        return cls(frozenset(pairs), result.acked, result.stale, result.items, result.checkpoints)

    def count(self, total: SyncResult) -> None:
        total.acked += self.acked
        total.stale += self.stale
        total.items += self.items
        total.checkpoints += self.checkpoints
