"""What scrapy-ha's Lua scripts take and give back: the records (a lease, a new entry, a
sync's result, the crawl's counts) and how a request, a lease pair or a renewal is packed
into script arguments and read back from a reply. :mod:`scrapy_ha.store.queue` makes the calls."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from scrapy_ha.store.hosts import payload_host
from scrapy_ha.store.scripts import MAX_PRIORITY, PRIORITY_STEP

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from scrapy import Request


#: Milliseconds a worker's number in ``sent`` is kept after a join or a finish first saw the
#: worker gone (lib/senders.lua): a day, as the per-minute counters. A worker frozen (SIGSTOP,
#: a paused VM) for less finds its number when it comes back; without it, it would store
#: again the start requests it kept (those of its last 10 s), into a crawl that may have
#: finished meanwhile. A killed worker's number costs a few dozen bytes for that day.
SENT_GRACE_MS = 24 * 3600 * 1000

#: Random bytes per call in lease tokens: 48 bits, so two calls share a nonce with odds
#: ~1e-14 (and then their counters must match too).
NONCE_BYTES = 6
#: Orders within one priority: Scrapy's default is LIFO (depth-first).
ORDERS = ("lifo", "fifo")

#: A worker's nonce and the number of the first of the children a sync call sends (the
#: worker numbers its children 1, 2, ... in the order it sends them).
Sender = tuple[str, int]


@dataclass(frozen=True)
class Lease:
    """One leased entry: its id, the token that fences it, and its payload; *wait_ms*: how
    long it must wait before it starts, for its domain's crawl-wide rate limit."""

    id: str
    token: str
    payload: bytes
    expiries: int = 0
    wait_ms: int = 0
    #: its place in Redis's order (see :func:`score_key`; None: unknown): the buffer keeps
    #: that order across lease calls
    place: tuple[int, int] | None = None


@dataclass
class SyncResult:
    """Reply of :meth:`RedisQueue.sync`."""

    now_ms: int
    added: int
    acked: int
    stale: int
    pending: int
    leased: int
    delayed: int
    refused: int = 0  # children whose parent's lease was no longer current (not enqueued)
    set_aside: int = 0  # pending members without an entry id, dead-lettered as corrupt
    roots_seen: int = 0  # requests without a parent (start requests) the dupefilter had seen
    paused: bool = False  # `scrapy-ha pause` is in force: nothing was leased
    #: the place of the first pending entry left, as (minus its priority, its place within
    #: it) (None: none is pending): a buffered request it goes before waits for it
    head: tuple[int, int] | None = None
    released: int = 0  # leases given back to pending
    #: the gates that changed after the gate number the call gave (domain -> server ms it
    #: opens; 0: open now, expired or opened early by an operator), see :class:`GateLog`
    gates: dict[str, int] = field(default_factory=dict)
    #: the number of the crawl's last gate change (0: none yet)
    gate_number: int = 0
    #: entry ids of taken requests (see :class:`Fresh`) not stored: duplicates, or refused
    dropped: set[str] = field(default_factory=set)
    leases: list[Lease] = field(default_factory=list)
    #: items the accepted acks added to the crawl's item stream (see :class:`Commit`)
    items: int = 0
    #: checkpoints the accepted acks carried (saved, kept aside, or behind the task's)
    checkpoints: int = 0
    set_aside_at: list[int] = field(default_factory=list)  # set_aside's: each shard call's now_ms


class Reclaimed(NamedTuple):
    """Reply of :meth:`RedisQueue.reclaim`."""

    reclaimed: int
    poison: list[str]
    set_aside: int = 0
    #: the script's time, the dead-letter time of what it set aside (None: several shards')
    now_ms: int | None = None


@dataclass(frozen=True)
class Counts:
    """Size of each state of the crawl at one instant."""

    now_ms: int
    pending: int
    leased: int
    delayed: int
    dead: int
    workers: int
    fingerprints: int

    @classmethod
    def from_reply(cls, reply: Iterable[Any]) -> Counts:
        """The reply of counts.lua: ``now_ms`` then each size, in the order of the fields."""
        now, pending, leased, delayed, dead, workers, fingerprints = (int(x) for x in reply)
        return Counts(now, pending, leased, delayed, dead, workers, fingerprints)

    @property
    def active(self) -> int:
        """Requests that still have to be processed by some worker."""
        return self.pending + self.leased + self.delayed

    def as_dict(self) -> dict[str, int]:
        return {
            "pending": self.pending,
            "leased": self.leased,
            "delayed": self.delayed,
            "dead": self.dead,
            "workers": self.workers,
            "fingerprints": self.fingerprints,
        }


@dataclass(frozen=True)
class Finished:
    """What :meth:`RedisQueue.finish` did: true when the crawl was finished and this worker
    ended it; *sessions*: the session cookies it dropped from the shared jars (a persisted
    crawl keeps its jars, not the sessions of the run that ended)."""

    done: bool
    sessions: int = 0

    @classmethod
    def from_reply(cls, reply: Iterable[Any]) -> Finished:
        """The reply of finish.lua: ``{done (1 or 0), session cookies dropped}``."""
        done, sessions = (int(x) for x in reply)
        return cls(bool(done), sessions)

    def __bool__(self) -> bool:
        return self.done


@dataclass(eq=False, slots=True)
class Fresh:
    """A new request of this worker that its engine may have before Redis does.

    Until a sync call sends it (``sealed``), the scheduler may hand it out from memory; it
    then gets a lease made by the worker (``lease``: entry id and token), and the sync
    script stores it leased to this worker under that lease instead of pending. A ``kept``
    one has such a lease without having been handed out: it joins the worker's buffer once
    stored (see :mod:`scrapy_ha.scheduler.keep`). A ``late`` one, a link of a page the
    worker redoes, never downloads before it is stored (``HA_EARLY_DOWNLOAD``).
    """

    request: Request
    lease: tuple[str, str] | None = None
    sealed: bool = False
    kept: bool = False
    late: bool = False


@dataclass(slots=True)  # never changed, but not frozen: a frozen __init__ costs 4x, per request
class NewEntry:
    """A request to enqueue: fingerprint (``b""`` for never filtered), priority, payload,
    the lease ``(entry id, token)`` of the page that yielded it (None for a root), and, for
    a request of this worker's own, its :class:`Fresh` state."""

    fingerprint: bytes
    priority: int
    payload: bytes
    parent: tuple[str, str] | None = None
    fresh: Fresh | None = None
    #: a start request kept in its own queue (SCHEDULER_START_*_QUEUE): after the others
    start: bool = False
    #: the checkpointed task of the request (``ha_task``): a sharded crawl places it by task
    task: str = ""
    #: ``ha_recrawl_after`` in ms (0: the crawl's ``HA_DUPEFILTER_TTL``; lua/lib/aged.lua)
    age_ms: int = 0
    #: the host of its URL (``store.hosts``): its back queue's and domain's ("": the payload's)
    host: str = ""

    @property
    def taken(self) -> tuple[str, str] | None:
        """The worker-made lease of a request already handed out or kept (None: store it
        pending)."""
        return self.fresh.lease if self.fresh is not None else None

    @property
    def kept(self) -> bool:
        """Stored leased to this worker for its buffer, not handed out yet."""
        return self.fresh is not None and self.fresh.kept


@dataclass(frozen=True)
class Commit:
    """What a page commits with its ack, in the same script call, under its lease
    (``lib/commit.lua``): the items it yielded (each as the codec wrote it) and its task's
    checkpoint, ``(task, document, time to live in ms)``."""

    items: tuple[bytes, ...] = ()
    checkpoint: tuple[str, bytes, int] | None = None


def text(value: Any) -> str:
    """A Redis reply as text; bytes that are not UTF-8 (a member written by hand) escaped."""
    return value.decode(errors="backslashreplace") if isinstance(value, bytes) else str(value)


_s = text  # (the name the scripts' readers use)


def score_key(score: Any) -> tuple[int, int] | None:
    """The place a pending score stands for, as (minus its priority, its place within that
    priority): lower goes first (None for ``''``: no pending entry)."""
    if not score:
        return None
    value = int(float(score))  # exact: scores stay below 2**53 (see lib/priority.lua)
    return divmod(value, PRIORITY_STEP)


def clamp_priority(priority: int) -> int:
    """The priority as stored: clamped to ``-MAX_PRIORITY .. MAX_PRIORITY``."""
    return max(-MAX_PRIORITY, min(MAX_PRIORITY, priority))


def packed_children(
    entries: list[NewEntry],
    sender: Sender | None = None,
    numbers: Sequence[int] = (),
    wire: Callable[[bytes], bytes] | None = None,
) -> list[bytes]:
    """The requests of a sync call, one argument each. With *sender* (a worker's nonce and
    the number of its first child here), each carries its number in its worker's order, so
    that a call sent again after its reply was lost stores and counts none of them twice.
    *numbers*, when given, are the children's own numbers (children stored again after a
    failover lost them keep the numbers they were first sent with). *wire*: a fingerprint
    as the dupefilter takes it (store/buckets.py)."""
    nonce, first = (sender[0].encode(), sender[1]) if sender else (b"", 0)
    numbered = numbers or range(first, first + len(entries))
    sent = (b"%s.%d" % (nonce, n) if sender else b"-" for n in numbered)
    return [_packed(e, s, wire) for s, e in zip(sent, entries, strict=bool(sender))]


def packed_acks(
    acks: Sequence[tuple[str, str]],
    commits: Mapping[tuple[str, str], Commit],
    checkpoint_keys: Callable[[str], tuple[str, str]],
    first_key: int,
) -> tuple[list[bytes], list[str]]:
    """The ack arguments of a sync call, each with what its page commits (see
    ``lib/commit.lua``), and the checkpoint keys to add to the call's KEYS after its
    *first_key* - 1 others (``checkpoint_keys(task)``: the task's key and ahead hash)."""
    args: list[bytes] = []
    keys: list[str] = []
    for pair in acks:
        head = b"%s %s" % (pair[0].encode(), pair[1].encode())
        commit = commits.get(pair)
        if commit is None:
            args.append(head)
            continue
        c, tail = b"-", []
        if commit.checkpoint is not None:
            task, doc, ttl_ms = commit.checkpoint
            c = b"%d/%d" % (first_key + len(keys), ttl_ms)
            keys += checkpoint_keys(task)
            tail = [doc]
        records = [b"%d:%s" % (len(x), x) for x in (*commit.items, *tail)]
        args.append(b"%s %d %s %s" % (head, len(commit.items), c, b"".join(records)))
    return args, keys


def expect_arg(sender: Sender | None, expect: int) -> str:
    """sync.lua's ARGV[8]: the newest of the worker's children the server must hold."""
    return f"{sender[0]}.{expect}" if sender is not None and expect > 0 else "-"


class ChildrenLost(Exception):
    """The server lacks children it confirmed to this worker (a failover to a replica that
    had not received them): the sync was refused whole; store them again, then retry."""

    def __init__(self, have: int, expected: int) -> None:
        super().__init__(f"Redis holds this worker's children up to number {have}, not {expected}")
        self.have = have


#: sync.lua's refusal: "LOSTCHILDREN <the server's number> <the number expected>"
LOST_CHILDREN = re.compile(r"LOSTCHILDREN (\d+) (\d+)")


def children_lost(exc: Exception) -> ChildrenLost | None:
    """The :class:`ChildrenLost` a sync's error reply means (None: another error)."""
    found = LOST_CHILDREN.match(str(exc))
    return ChildrenLost(int(found[1]), int(found[2])) if found else None


def _packed(e: NewEntry, sent: bytes, wire: Callable[[bytes], bytes] | None) -> bytes:
    """One request as one script argument: fewer arguments to pack is most of the client's
    cost per request (see docs/benchmarks.md)."""
    fingerprint = wire(e.fingerprint) if wire else e.fingerprint
    return b"%d%s%s %s %s %s %s %02d%s%s" % (
        clamp_priority(e.priority),
        b"s" if e.start else b"",
        b"@%d" % e.age_ms if e.age_ms else b"",
        _pair(e.parent),
        b"=" + _pair(e.taken) if e.kept else _pair(e.taken),
        sent,
        (e.host or payload_host(e.payload)).encode(),
        len(fingerprint),
        fingerprint,
        e.payload,
    )


def _pair(pair: tuple[str, str] | None) -> bytes:
    return b"%s/%s" % (pair[0].encode(), pair[1].encode()) if pair else b"-"


def new_nonce() -> str:
    """A random part of the lease tokens of one script call: tokens never repeat, even
    after a flush or a failover that rolled the token counter back."""
    return secrets.token_hex(NONCE_BYTES)


def _b(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


#: The fixed fields at the head of sync.lua's reply (the lists follow them).
HEADER = 18
#: The fields of a lease in sync.lua's reply, its payload apart.
LEASE_FIELDS = 5


def sync_result(reply: list[Any]) -> SyncResult:
    """The reply of ``sync.lua`` (see its header and its end: the 18 numbers, the gates'
    pairs, the fields of the dropped ids and the leases in one element, space-separated,
    then one payload per lease) as a :class:`SyncResult`."""
    n_gates, n_dropped = int(reply[11]), int(reply[12])
    at = HEADER + 2 * n_gates
    gates = {_s(reply[i]): _gate_time(reply[i + 1]) for i in range(HEADER, at, 2)}
    lists, payloads = reply[at], reply[at + 1 :]
    fields = lists.split(b" ") if lists else []
    dropped = {_s(x) for x in fields[:n_dropped]}
    if len(fields) - n_dropped != LEASE_FIELDS * len(payloads):
        raise ValueError(
            f"sync reply: {len(fields) - n_dropped} lease fields for {len(payloads)} payloads"
        )
    leases = [
        Lease(
            _s(fields[i]),
            _s(fields[i + 1]),
            _b(payload),
            int(fields[i + 2]),
            int(fields[i + 3]),
            place=_place(fields[i + 4]),
        )
        for i, payload in zip(range(n_dropped, len(fields), LEASE_FIELDS), payloads, strict=True)
    ]
    now, added, acked, stale, pending, leased, delayed, refused, aside, roots, paused = map(
        int, reply[:11]
    )
    return SyncResult(
        now,
        *(added, acked, stale, pending, leased, delayed, refused, aside, roots),
        paused=bool(paused),
        head=score_key(reply[13]),
        released=int(reply[14]),
        gates=gates,
        leases=leases,
        dropped=dropped,
        items=int(reply[15]),
        checkpoints=int(reply[16]),
        gate_number=int(reply[17]),
    )


def _gate_time(value: Any) -> int:
    """A gate's opening time from the reply (whole ms, as sync.lua writes it; 0: open now);
    0 for garbage (an older script passed the hash's text on: 'nan', '1e999'): open."""
    try:
        return max(0, int(value))
    except ValueError:
        return 0


def _place(score: bytes) -> tuple[int, int] | None:
    """A lease's place from the reply: none (unknown) where the score is not a number (the
    script sets aside the elements whose id text would give one: a guard, not a path)."""
    try:
        return score_key(score)
    except (ValueError, OverflowError):
        return None
