"""What the scheduler's shell hands to its Redis session, and the order Redis sees it in.

The shell (:mod:`scrapy_ha.scheduler`) runs on the engine's synchronous calls and never
waits on Redis; the session (:mod:`scrapy_ha._session`) is the one task that talks to Redis.
Everything the shell decides that Redis must learn goes through one :class:`Outbox`: the
shell fills it, the session drains it, in :data:`SEND_ORDER`.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy import Request

    from scrapy_ha._queue import NewEntry
    from scrapy_ha._wire import Sender

#: (entry id, lease token): one lease.
Pair = tuple[str, str]
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
#: - ``acks``, then ``ends`` (retries, dead letters, deferrals) of the same round.
SEND_ORDER = ("gates", "releases", "children", "checkpoints", "acks", "ends")


@dataclass(frozen=True)
class EndOp:
    """A finished request whose lease ends otherwise than by an ack."""

    kind: str  # "retry", "dead" or "defer" (a closed domain: wait without an attempt)
    entry_id: str
    token: str
    request: Request
    delay: float = 0.0
    priority: int | None = None  # a retry's: its retry copy's (RETRY_PRIORITY_ADJUST)


@dataclass(frozen=True)
class CheckpointSave:
    """A task's checkpoint, saved under the lease of the page that reached it."""

    entry_id: str
    token: str
    task: str
    doc: bytes
    ttl_ms: int


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
    ends: list[EndOp] = field(default_factory=list)
    #: highest priority among ``children`` (None: none): a new request may outrank the buffer
    top: int | None = None
    #: the shell held a request back for an outranking child: the next sync wakes the engine
    held_back: bool = False
    #: names this run's children in Redis, numbered in the order they are sent (see sync.lua)
    nonce: str = field(default_factory=lambda: secrets.token_hex(SENDER_NONCE_BYTES))
    #: children Redis has had (removed from the head of ``children``)
    children_sent: int = 0

    def add_child(self, entry: NewEntry) -> None:
        """Queue *entry*; a fresh one (see :mod:`scrapy_ha._fresh`) counts in ``top`` only
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
        """Anything for the sync script: children, checkpoints, acks or ends."""
        return bool(self.children or self.checkpoints or self.acks or self.ends)

    def held_pairs(self) -> list[Pair]:
        """The leases named here: finished (acks, ends) or given back (releases)."""
        return self.acks + [(op.entry_id, op.token) for op in self.ends] + self.releases
