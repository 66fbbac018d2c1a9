"""What the scheduler's shell hands to its Redis session, and the order Redis sees it in.

The shell (:mod:`scrapy_ha.scheduler`) runs on the engine's synchronous calls and never
waits on Redis; the session (:mod:`.session.session`) is the one task that talks to Redis.
Everything the shell decides that Redis must learn goes through one :class:`Outbox`: the
shell fills it, the session drains it, in :data:`SEND_ORDER`.
"""

from __future__ import annotations

import math
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scrapy_ha.store.wire import Fresh, NewEntry

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from scrapy import Request

    from scrapy_ha.store.wire import Commit, Sender

#: (entry id, lease token): one lease.
Pair = tuple[str, str]
#: A child as a worker keeps it (:class:`Retained`), one flat tuple of plain values: its
#: number, when Redis stored it, and its :class:`NewEntry`'s fields (its age and host too: a
#: child stored again is filtered and queued as it was the first time), with the lease it was
#: handed out or kept under (``taken``) and whether it was kept instead of its
#: :class:`Fresh` state, whose request object is not kept alive.
Stored = tuple[
    int, float, bytes, int, bytes, "Pair | None", "Pair | None", bool, bool, str, int, str
]
#: Random bytes naming the children of one worker run in Redis (``<nonce>.<n>``): 64 bits,
#: two runs share one with odds ~1e-19.
SENDER_NONCE_BYTES = 8

#: The order in which the session sends an outbox's contents to Redis, and why:
#: - ``gates`` first: a domain closed by a 429 holds every worker, the sooner the better;
#: - ``releases``: buffered leases given back untouched (no children, nothing to ack);
#: - ``children`` before everything that ends or marks their parent: a request a callback
#:   yielded is durable before its page is acked (nothing is lost if the worker dies);
#: - ``checkpoints`` after the children (a resumed task never starts past a child that was
#:   not stored) and before the acks (a checkpoint is fenced by its page's lease, which the
#:   ack ends);
#: - ``acks`` (each with what its page commits, ``commits``: its items, and with the item
#:   outbox its task's checkpoint), then ``ends`` (retries, dead letters, deferrals) of the
#:   same round.
#: ``loose_items`` (items no page yielded) go before the rest of a sync, on their own.
SEND_ORDER = ("gates", "releases", "children", "checkpoints", "acks", "ends")


#: Requests per sync call that stores children (children always go before acks).
BATCH = 500
#: Payload bytes per sync call that stores children, at most (a child larger alone goes alone:
#: up to ``MAX_PAYLOAD_BYTES``). Redis runs a call whole, about 12 ms a megabyte here, and
#: every client of the crawl waits meanwhile: 300 children of 1 MB of meta in one call held
#: Redis 4.9 s (a PING waited 8.2 s), and 500 of 2 MB would pass the 1 GB a client may send.
BATCH_BYTES = 8 * 1024 * 1024
#: Seconds a request without a parent (a start request) is kept after Redis stored it, to
#: store it again if a failover loses it: far longer than a healthy replica lags behind.
ROOT_RETENTION = 10.0
#: Seconds a root is kept at most while the server's last RDB snapshot predates it (RDB
#: alone: see :mod:`.session.durable`), an hour: Redis's longest default ``save`` interval.
ROOT_MAX_AGE = 3600.0
#: Seconds between two prunings of the kept children (each costs a pass over them).
PRUNE_INTERVAL = 1.0


def batch_end(children: list[NewEntry], start: int = 0) -> int:
    """The end of the batch of *children* that starts at *start*: at most :data:`BATCH` of
    them and :data:`BATCH_BYTES` of payload, but at least one."""
    end, size, last = start, 0, min(len(children), start + BATCH)
    while end < last:
        size += len(children[end].payload)
        if size > BATCH_BYTES and end > start:
            break
        end += 1
    return end


@dataclass
class Retained:
    """Children Redis has stored that this worker keeps, with their numbers, while a
    failover could still lose them and nothing would bring them back.

    Redis replicates asynchronously: a primary can confirm children and die before its
    replica has them. If the page that yielded them is then acked on the promoted replica,
    they are lost (its lease is there, its children are not). So a child is kept until its
    parent's end is confirmed (a server that then loses the children loses that ack too,
    and the page is done again), and a child without a parent for :data:`ROOT_RETENTION`
    (on a server with RDB snapshots alone, until a snapshot has it: :attr:`on_disk`) and
    as long as this worker crawls it.
    Every sync names the newest child kept (sync.lua's ``expect``); a server that lacks it
    refuses the call, and the worker stores them again first (:meth:`lost`).

    What is kept is the child as sent, never its request object: the lease it was handed out
    or kept under, if any, is all a server that lost it needs (stored again leased to this
    worker, while this worker still holds that lease; crawled and ended, it goes pending:
    :meth:`lost` reads which). A crawl at 500 pages/s keeps some 5,000 roots at
    a time: kept alive, each request object would be a dozen objects more for every pass of
    Python's garbage collector, and the requests a round handed out would outlive their
    download until the next pruning. Each child is one flat tuple of plain values
    (:data:`Stored`), not a :class:`NewEntry`: the collector stops tracking such a tuple at
    its first pass over it, so thousands of kept children cost its later passes nothing.
    """

    #: children of a page (the child's number, time stored, its fields), in number order
    parented: list[Stored] = field(default_factory=list)
    #: roots (children of no page), in number order: the order they were stored in
    roots: deque[Stored] = field(default_factory=deque)
    #: roots past :data:`ROOT_RETENTION` this worker still crawls, in number order
    crawled_roots: list[Stored] = field(default_factory=list)
    #: off for a sharded crawl, whose shards do not number children
    enabled: bool = True
    #: the clock of the times kept and of the prunings (``bench/worker_cost.py`` gives one
    #: that runs at a worker's pace: its counts then do not depend on how fast it runs)
    clock: Callable[[], float] = time.monotonic
    #: the time (:attr:`clock`) before which the server has every write on disk: a root
    #: stored later is kept past :data:`ROOT_RETENTION` (inf: AOF on, or not known)
    on_disk: float = math.inf
    _pruned: float = 0.0

    @property
    def entries(self) -> list[Stored]:
        """Every child kept, in number order."""
        return sorted([*self.parented, *self.crawled_roots, *self.roots], key=_number)

    def keep(self, first: int, children: list[NewEntry]) -> None:
        if self.enabled and children:
            now = self.clock()
            for i, e in enumerate(children):
                (self.roots if e.parent is None else self.parented).append(_kept(first + i, now, e))

    def newest(self) -> int:
        """The number every server this worker syncs with must hold (0: none)."""
        parts = (self.parented, self.roots, self.crawled_roots)
        return max((part[-1][0] for part in parts if part), default=0)

    def prune(self, held: Callable[[], Iterable[Pair]]) -> None:
        """Forget the children no failover can lose any more (at most every
        :data:`PRUNE_INTERVAL`): a parent no longer *held* has had its end confirmed; a root
        is kept for :data:`ROOT_RETENTION`, and while this worker crawls it.

        A pass looks at the children of pages and at the roots whose time is up, not at the
        younger roots (a crawl fed start URLs at 500 a second keeps some 5,000 of them: a
        pass over all, every second, cost each root ten looks). A lease this worker no longer
        holds never comes back (see ``_held_pairs``): :meth:`lost` reads whether it still
        holds a child's when it stores the child again."""
        now = self.clock()
        if not (self.parented or self.roots or self.crawled_roots):
            return
        if now - self._pruned < PRUNE_INTERVAL:
            return
        self._pruned = now
        open_ = set(held())
        self.parented = [e for e in self.parented if e[5] in open_]
        crawled = [e for e in self.crawled_roots if e[6] in open_]
        roots = self.roots
        while roots and self._past(roots[0][1], now):
            e = roots.popleft()
            if e[6] in open_:  # (None, a root not handed out, is never in it)
                crawled.append(e)
        self.crawled_roots = crawled

    def _past(self, at: float, now: float) -> bool:
        """A root kept since *at* may go: past its retention and on disk, or too old."""
        age = now - at
        return age >= ROOT_RETENTION and at < self.on_disk or age >= ROOT_MAX_AGE

    def overdue(self, now: float) -> bool:
        """Some root is past :data:`ROOT_RETENTION` (kept for a snapshot, or to prune)."""
        return self.enabled and bool(self.roots) and now - self.roots[0][1] >= ROOT_RETENTION

    def children(self) -> list[NewEntry]:
        """The children kept, in number order, each under the lease it was kept with (held
        or not: :meth:`lost` gives what a server that lost them gets)."""
        return [_entry(e) for e in self.entries]

    def lost(self, have: int, held: Iterable[Pair]) -> tuple[list[int], list[NewEntry]]:
        """The children a server holding this worker's children up to number *have* lacks,
        and their numbers. One handed out from memory that this worker no longer holds (it
        was done and acked, on the server that lost it) goes back pending, to be done again
        with the children it yielded, which no one keeps any more."""
        open_ = set(held)
        numbers, children = [], []
        for e in self.entries:
            if e[0] > have:
                numbers.append(e[0])
                done = e[6] is not None and e[6] not in open_
                children.append(_entry((*e[:6], None, False, *e[8:]) if done else e))
        return numbers, children


def _number(e: Stored) -> int:
    return e[0]


def _kept(n: int, at: float, entry: NewEntry) -> Stored:
    """*entry* as kept: its lease if it was handed out or kept, never its request object."""
    fresh = entry.fresh
    taken, kept = (None, False) if fresh is None else (fresh.lease, fresh.kept)
    return (
        n,
        at,
        entry.fingerprint,
        entry.priority,
        entry.payload,
        entry.parent,
        taken,
        kept,
        entry.start,
        entry.task,
        entry.age_ms,
        entry.host,
    )


def _entry(e: Stored) -> NewEntry:
    """A kept child as it is stored again: under its lease, if it has one (see :func:`_leased`)."""
    taken = e[6]
    fresh = None if taken is None else _leased(taken, kept=e[7])
    return NewEntry(e[2], e[3], e[4], e[5], fresh, e[8], e[9], e[10], e[11])


def _leased(taken: Pair, *, kept: bool) -> Fresh:
    """The :class:`Fresh` state of a child stored again under its lease *taken*: sealed, and
    without its request object, which a store never reads (the child goes as it was sent,
    its payload; the request, if this worker still crawls it, is the engine's). Reading it
    fails (AttributeError): nothing may act on a request it does not hold."""
    fresh = Fresh.__new__(Fresh)
    fresh.lease, fresh.sealed, fresh.kept = taken, True, kept
    return fresh


@dataclass(frozen=True)
class VisitEnd:
    """A finished visit of a revisited request (see :mod:`scrapy_ha.scheduler.revisits`):
    the interval to its next (seconds), its URL's fingerprint (one revisit entry per URL),
    what it found, the bytes a 304 saved."""

    interval: float
    fingerprint: bytes
    found: str
    saved: int = 0
    #: adaptive revisits: the crawl's budget (None: fixed revisits) and what this visit
    #: changes of the intervals' load
    allocation: Allocation | None = None
    load: Load | None = None
    #: the URL is recorded as seen again (False: the crawl does not deduplicate)
    seen: bool = True


@dataclass
class Allocation:
    """What adaptive revisits share with Redis: the crawl's multiplier (the marginal gain a
    visit a second must buy; :mod:`scrapy_ha.config.freshness`), as the last revisit of
    this worker read it (0: none yet), the budget (visits a second; 0: what the
    configured intervals would make), and the range Redis keeps the multiplier in
    (:func:`~scrapy_ha.config.freshness.multiplier_range`)."""

    budget: float
    multiplier: float = 0.0
    lowest: float = 0.0
    highest: float = 0.0


@dataclass(frozen=True)
class Load:
    """What one revisit changes of the crawl's sums (visits a second): its new interval's
    ``1 / interval`` less its last's, and the configured interval's at its first visit;
    and what its entry holds in them (its last interval's and the configured one's; 0 at
    its first visit), taken out if it turns out a double (another entry revisits the URL).
    """

    load: float
    base: float
    first_multiplier: float
    held: float = 0.0
    held_base: float = 0.0


@dataclass(frozen=True)
class EndOp:
    """A finished request whose lease ends otherwise than by an ack."""

    kind: str  # "retry", "dead", "defer" (a closed domain: wait without an attempt), "revisit"
    entry_id: str
    token: str
    request: Request
    delay: float = 0.0
    priority: int | None = None  # a retry's: its retry copy's (RETRY_PRIORITY_ADJUST)
    visit: VisitEnd | None = None  # a revisit's: when, and what the visit found
    commit: Commit | None = None  # a revisit's: what its page commits (HA_ITEMS="outbox")


@dataclass(frozen=True)
class CheckpointSave:
    """A task's checkpoint, saved under the lease of the page that reached it."""

    entry_id: str
    token: str
    task: str
    doc: bytes
    ttl_ms: int


def latest_saves(saves: list[CheckpointSave]) -> int:
    """Drop from *saves* every save of a task that a later one under the same page's lease
    supersedes (a page's mid-page progress only grows): a callback or a pipeline that
    keeps the event loop busy queued them faster than one a round trip went, and the
    checkpoint in Redis fell ever further behind the items done. How many were dropped."""
    last = {(cp.task, cp.entry_id, cp.token): i for i, cp in enumerate(saves)}
    if len(last) == len(saves):
        return 0
    kept = [cp for i, cp in enumerate(saves) if last[cp.task, cp.entry_id, cp.token] == i]
    dropped = len(saves) - len(kept)
    saves[:] = kept
    return dropped


@dataclass
class Outbox:
    """Everything the shell has for Redis, sent in :data:`SEND_ORDER`.

    The shell appends; the session removes an item only once Redis has it, so an item that
    fails to go (Redis away) goes next round. Every lease named here is still held by this
    worker (renewed) until it is sent.
    """

    gates: dict[str, float] = field(default_factory=dict)  # domain -> seconds closed
    releases: list[Pair] = field(default_factory=list)
    children: list[NewEntry] = field(default_factory=list)
    checkpoints: list[CheckpointSave] = field(default_factory=list)
    acks: list[Pair] = field(default_factory=list)
    #: what the page of an ack commits with it (HA_ITEMS = "outbox"), by its lease
    commits: dict[Pair, Commit] = field(default_factory=dict)
    ends: list[EndOp] = field(default_factory=list)
    #: items with no page to ride with (yielded by start()), committed as they come
    loose_items: list[bytes] = field(default_factory=list)
    #: highest priority among ``children`` (None: none): a new request may outrank the buffer
    top: int | None = None
    #: the shell held a request back for an outranking child: the next sync wakes the engine
    held_back: bool = False
    #: names this run's children in Redis, numbered in the order they are sent (see sync.lua)
    nonce: str = field(default_factory=lambda: secrets.token_hex(SENDER_NONCE_BYTES))
    #: children Redis has had (removed from the head of ``children``)
    children_sent: int = 0
    #: loose items Redis has had, numbered as children are (items_add.lua)
    loose_sent: int = 0
    #: children Redis has had that a failover could still lose
    retained: Retained = field(default_factory=Retained)

    def add_child(self, entry: NewEntry) -> None:
        """Queue *entry*; a fresh one (see :mod:`scrapy_ha.scheduler.fresh`) counts in ``top`` only
        once a round sends it without its having been handed out (:meth:`note_priority`)."""
        self.children.append(entry)
        if entry.fresh is None:
            self.note_priority(entry.priority)

    def sender(self) -> Sender:
        """This worker's nonce and the number of ``children[0]``: a call that sends the head
        of ``children`` again (its earlier reply was lost) gives each the same number."""
        return self.nonce, self.children_sent + 1

    def children_stored(self, n: int) -> None:
        """Redis has the first *n* children."""
        self.retained.keep(self.children_sent + 1, self.children[:n])
        del self.children[:n]
        self.children_sent += n

    def note_priority(self, priority: int) -> None:
        if self.top is None or priority > self.top:
            self.top = priority

    def close_gate(self, domain: str, seconds: float) -> None:
        self.gates[domain] = max(seconds, self.gates.get(domain, 0))

    def recompute_top(self) -> None:
        self.top = max(
            (
                entry.priority
                for entry in self.children
                if entry.fresh is None or (entry.fresh.sealed and entry.fresh.lease is None)
            ),
            default=None,
        )

    def to_sync(self) -> bool:
        """Anything for a sync: children, checkpoints, acks, ends, or items."""
        box = self
        return bool(box.children or box.checkpoints or box.acks or box.ends or box.loose_items)

    def held_pairs(self) -> list[Pair]:
        """The leases named here: finished (acks, ends) or given back (releases)."""
        return self.acks + [(op.entry_id, op.token) for op in self.ends] + self.releases
