"""What waits in a crawl, and when it can be done: the delayed set by due time and by why
(a retry, a closed domain gate, a domain's limits, a revisit's next visit), and an ETA
that counts waiting work by its due time (none for a continuous crawl: it never ends by
itself).

The delayed set may hold millions of entries: it is never read whole. Its due times are
sampled by rank (``store/lua/due.lua``: :data:`SAMPLES` buckets per shard), each sample
standing for the entries of its bucket, at the bucket's latest due time: the ETA never
comes before the last retry is due. Why entries wait is counted in the crawl's ``held`` hash
(``store/lua/lib/held.lua`` keeps a count per why and domain beside the marks): its counts
are read, never its marks. New requests of a host behind a closed gate or at its limits do
not reach the delayed set: they wait in the host's back queue, parked in the crawl's
``waiting`` set; those are counted too, by host (one ``LLEN`` per waiting queue).
"""

from __future__ import annotations

__all__ = ["Eta", "Waiting", "ack_rate", "eta", "read_waiting"]

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy_ha.ops.display import time_ms
from scrapy_ha.ops.stats import MINUTE_MS
from scrapy_ha.store import scripts
from scrapy_ha.store.wire import text as _s

if TYPE_CHECKING:
    from scrapy_ha.keys import Keys
    from scrapy_ha.ops.stats import CrawlStats

#: Why a delayed entry waits without an attempt (its mark in ``held``, lib/held.lua).
HELD_KINDS = ("gate", "limit", "revisit", "proxy", "dictionary")
#: The shortest time an ack rate is measured over (a crawl's first acks, a second old).
MIN_SPAN_MS = 1000
#: Due times read per shard: an ETA within 1/64 of the delayed set's work of the exact one,
#: in one small round trip whatever the set's size.
SAMPLES = 64
#: Fields of ``held`` an ``HSCAN`` step looks at for its counts: a hash of a few thousand
#: marks in one step (Redis looks at them in C; only the counts come back).
HELD_SCAN = 10_000
#: Waiting back queues whose requests are counted per shard: a host each, so a crawl with
#: more hosts waiting at once than this shows the first ones (by the time they are due).
WAITING_QUEUES = 10_000
#: The window of the ack rate the ETA divides by (minutes): long enough to smooth a slow
#: page or a pause between batches, short enough to follow a crawl that speeds up.
ETA_WINDOW = 5


@dataclass(frozen=True)
class Waiting:
    """The delayed set of a crawl (every shard): due-time samples and why entries wait."""

    #: (due time in server ms, entries it stands for), soonest first
    due: list[tuple[int, int]] = field(default_factory=list)
    #: delayed entries waiting without an attempt: kind ('gate', 'limit', 'revisit') ->
    #: domain -> n
    held: dict[str, dict[str, int]] = field(default_factory=dict)
    #: delayed entries waiting without an attempt, whatever their why (the pending requests
    #: of waiting back queues are in ``held`` but not here: they are not delayed entries)
    held_total: int = 0
    #: of ``held``, the pending requests of back queues parked in ``waiting`` until a time
    #: to come: kind ('gate', 'limit') -> host -> n
    parked: dict[str, dict[str, int]] = field(default_factory=dict)
    #: (time in server ms, pending requests) of each back queue parked until a time to
    #: come, soonest first: the ETA counts them from then, as delayed work
    parked_due: list[tuple[int, int]] = field(default_factory=list)

    @property
    def delayed(self) -> int:
        return sum(n for _, n in self.due)

    def held_by(self, kind: str) -> int:
        return sum(self.held.get(kind, {}).values())

    def marked(self, kind: str) -> dict[str, int]:
        """The delayed entries of ``held`` (its parked back queues left out), by domain."""
        parked = self.parked.get(kind, {})
        found = {d: n - parked.get(d, 0) for d, n in self.held.get(kind, {}).items()}
        return {d: n for d, n in found.items() if n > 0}

    @property
    def retries(self) -> int:
        """Delayed entries that are retries (an attempt failed), not held-back work."""
        return max(0, self.delayed - self.held_total)

    @property
    def revisits(self) -> int:
        """Revisits waiting for their next visit: the crawl is continuous while there are."""
        return self.held_by("revisit")

    @property
    def last_due_ms(self) -> int | None:
        return self.due[-1][0] if self.due else None


async def read_waiting(client: Any, shards: list[Keys]) -> Waiting:
    """The delayed sets of *shards* (every shard of a crawl), in one pipelined round trip
    (more only for a ``held`` hash larger than one ``HSCAN`` step): the due-time samples,
    and the counts of ``held``, never its marks."""
    pipe = client.pipeline(transaction=False)
    for keys in shards:
        pipe.eval(scripts.DUE_LUA, 1, keys.delayed, SAMPLES)
        pipe.hscan(keys.held, 0, match="#*", count=HELD_SCAN)
    replies = await pipe.execute()
    due: list[tuple[int, int]] = []
    held: dict[str, dict[str, int]] = {}
    for keys, flat, (cursor, counts) in zip(shards, replies[::2], replies[1::2], strict=True):
        due += [(time_ms(flat[i]), int(flat[i + 1])) for i in range(0, len(flat), 2)]
        while True:
            for name, n in counts.items():
                kind, _, domain = _s(name)[1:].partition(" ")
                domains = held.setdefault(kind, {})
                domains[domain] = domains.get(domain, 0) + _int(n)  # (garbage: 0)
            if not int(cursor):
                break
            cursor, counts = await client.hscan(keys.held, cursor, match="#*", count=HELD_SCAN)
    total = sum(sum(d.values()) for d in held.values())
    parked: dict[str, dict[str, int]] = {}
    parked_due: list[tuple[int, int]] = []
    for keys in shards:
        parked_due += await _waiting_queues(client, keys, parked)
    for kind, hosts in parked.items():
        domains = held.setdefault(kind, {})
        for host, n in hosts.items():
            domains[host] = domains.get(host, 0) + n
    return Waiting(sorted(due), held, total, parked, sorted(parked_due))


async def _waiting_queues(
    client: Any, keys: Keys, parked: dict[str, dict[str, int]]
) -> list[tuple[int, int]]:
    """Add to *parked* the pending requests of the back queues parked in ``waiting`` until
    a time to come: behind a closed gate ('gate') or at their domain's limits ('limit'), by
    host; returns each queue's (time, requests). A queue whose time has come is not held:
    the next lease takes it back (a paused crawl leases nothing)."""
    seconds, micros = await client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    rows = await client.zrange(  # those whose time has come left out, however many
        keys.waiting,
        f"({now_ms}",
        "+inf",
        byscore=True,
        offset=0,
        num=WAITING_QUEUES,
        withscores=True,
    )
    qids = [_s(qid) for qid, _ in rows]
    if not qids:
        return []
    pipe = client.pipeline(transaction=False)
    for qid in qids:
        pipe.llen(keys.queue(qid))
    pipe.hgetall(keys.gates)
    *lengths, gates = await pipe.execute()
    closed = {_s(d) for d, until in gates.items() if _int(until) > now_ms}
    for qid, n in zip(qids, lengths, strict=True):
        host = qid.partition(":")[2]
        hosts = parked.setdefault("gate" if host in closed else "limit", {})
        hosts[host] = hosts.get(host, 0) + int(n)
    return [(int(at), int(n)) for (_, at), n in zip(rows, lengths, strict=True) if n]


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):  # a count or time written by hand
        return 0


@dataclass(frozen=True)
class Eta:
    """When the crawl can be done at its recent pace, counting delayed work by due time."""

    #: seconds from now; None when unknown (nothing acked in the window, work left)
    seconds: float | None
    #: the latest due time of delayed work (server ms; None: nothing delayed)
    last_due_ms: int | None = None
    #: work left: pending + leased + delayed
    left: int = 0
    #: a continuous crawl (revisits wait for their next visit): it never ends by itself
    continuous: bool = False


def eta(
    stats: CrawlStats,
    waiting: Waiting,
    minutes: int = ETA_WINDOW,
    begun_ms: int | None = None,
    acked_before: int | None = None,
) -> Eta:
    """The time to finish, as one server processing at the ack rate of the last *minutes*
    would (of the time since the first ack's minute began, or since the run began
    (*begun_ms*, with the crawl's acks then: *acked_before*) if later, for a crawl younger
    than that: :func:`ack_rate`): work
    available now starts now, work due later not before its due time, so the end is the
    latest of ``t + (work due at t or after) / rate`` over now and each due time. 0.0 when
    nothing is left; None with ``continuous`` for a crawl that revisits pages."""
    left = stats.pending + stats.leased + waiting.delayed
    last = waiting.last_due_ms
    if waiting.revisits:
        return Eta(None, last, left, continuous=True)
    if not left:
        return Eta(0.0, last, 0)
    per_ms = ack_rate(stats, minutes, begun_ms, acked_before)
    if not per_ms:
        return Eta(None, last, left)
    now = stats.now_ms
    end = now + left / per_ms
    after = 0  # delayed work due at a sample's time or later, latest first
    # (and the pending requests parked behind a gate or a limit until their queue's time:
    # before, 20 parked behind a gate closed for 10 minutes read "eta 40s")
    for due, n in reversed(sorted(waiting.due + waiting.parked_due)):
        after += n
        if due > now:
            end = max(end, due + after / per_ms)
    return Eta((end - now) / 1000, last, left)


def ack_rate(
    stats: CrawlStats, minutes: int, begun_ms: int | None = None, acked_before: int | None = None
) -> float:
    """Acks per millisecond over the last *minutes*; for a crawl whose acks (or whose run,
    begun at *begun_ms*) are younger than that, over the time since they began: its first
    ack's minute counted from its start, or from the run's start when later (the run's
    acks: the crawl's now less *acked_before*, its acks when the run began, where the run
    recorded them; the minute's bucket also holds the run before's acks of that minute).
    Before, that time was rounded up to whole minutes: 251 acks in the first 25 s of a crawl
    made 251 a minute (10 a second made 4.2), and an ETA 2.4 times too long."""
    acked = stats.minutes.get("acked", {})
    first = min(acked, default=None)
    if first is None:
        return 0.0
    start = max(first * MINUTE_MS, begun_ms or 0)
    if start <= stats.now_ms - minutes * MINUTE_MS:
        return stats.rate("acked", minutes) / MINUTE_MS
    total = acks_since(stats, start // MINUTE_MS, begun_ms, acked_before)
    return total / max(stats.now_ms - start, MIN_SPAN_MS)


def acks_since(
    stats: CrawlStats, minute: int, begun_ms: int | None, acked_before: int | None
) -> int:
    """The acks of the buckets from *minute* on; of the run begun at *begun_ms* alone when
    that is within them and it recorded the crawl's acks then (*acked_before*)."""
    run = begun_ms is not None and begun_ms // MINUTE_MS >= minute
    if run and acked_before is not None and 0 <= stats.acked - acked_before:
        return stats.acked - acked_before
    return sum(n for m, n in stats.minutes.get("acked", {}).items() if m >= minute)
