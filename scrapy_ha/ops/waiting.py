"""What waits in a crawl, and when it can be done: the delayed set by due time and by why
(a retry, a closed domain gate, a domain's limits), and an ETA that counts waiting work
by its due time.

The delayed set may hold millions of entries: it is never read whole. Its due times are
sampled by rank (:data:`SAMPLES` ranks per shard, one pipelined round trip), each sample
standing for the entries of its bucket, at the bucket's latest due time: the ETA never
comes before the last retry is due. Why entries wait is read from the crawl's ``held`` hash
(``store/lua/lib/held.lua``), at most :data:`HELD_READ` marks per shard.
"""

from __future__ import annotations

__all__ = ["Eta", "Waiting", "eta", "read_waiting"]

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy_ha.ops.stats import MINUTE_MS

if TYPE_CHECKING:
    from scrapy_ha.keys import Keys
    from scrapy_ha.ops.stats import CrawlStats

#: Due times read per shard: an ETA within 1/64 of the delayed set's work of the exact one,
#: in one small round trip whatever the set's size.
SAMPLES = 64
#: Marks of ``held`` read to say why entries wait, per shard: a closed gate holds back the
#: requests of one domain (hundreds); a crawl with more is shown by its total alone.
HELD_READ = 20_000
#: The window of the ack rate the ETA divides by (minutes): long enough to smooth a slow
#: page or a pause between batches, short enough to follow a crawl that speeds up.
ETA_WINDOW = 5


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Waiting:
    """The delayed set of a crawl (every shard): due-time samples and why entries wait."""

    #: (due time in server ms, entries it stands for), soonest first
    due: list[tuple[int, int]] = field(default_factory=list)
    #: delayed entries waiting without an attempt: kind ('gate', 'limit') -> domain -> n
    held: dict[str, dict[str, int]] = field(default_factory=dict)
    #: marks in ``held``, read or not (HELD_READ caps what is read per shard)
    held_total: int = 0

    @property
    def delayed(self) -> int:
        return sum(n for _, n in self.due)

    def held_by(self, kind: str) -> int:
        return sum(self.held.get(kind, {}).values())

    @property
    def retries(self) -> int:
        """Delayed entries that are retries (an attempt failed), not held-back work."""
        return max(0, self.delayed - self.held_total)

    @property
    def last_due_ms(self) -> int | None:
        return self.due[-1][0] if self.due else None


async def read_waiting(client: Any, shards: list[Keys]) -> Waiting:
    """The delayed sets of *shards* (every shard of a crawl): two pipelined round trips."""
    pipe = client.pipeline(transaction=False)
    for keys in shards:
        pipe.zcard(keys.delayed)
        pipe.hlen(keys.held)
    sizes = await pipe.execute()
    pipe = client.pipeline(transaction=False)
    plan: list[list[int]] = []
    for i, keys in enumerate(shards):
        n, marks = int(sizes[2 * i]), int(sizes[2 * i + 1])
        plan.append(_bucket_ends(n))
        for rank in plan[-1]:
            pipe.zrange(keys.delayed, rank, rank, withscores=True)
        if 0 < marks <= HELD_READ:
            pipe.hvals(keys.held)
    replies = iter(await pipe.execute())
    due: list[tuple[int, int]] = []
    held: dict[str, Counter[str]] = {}
    for i, ends in enumerate(plan):
        start = 0
        for rank in ends:
            rows = next(replies)
            if rows:
                due.append((int(rows[0][1]), rank + 1 - start))
            start = rank + 1
        marks = int(sizes[2 * i + 1])
        if 0 < marks <= HELD_READ:
            for mark in next(replies):
                kind, _, domain = _s(mark).partition(" ")
                held.setdefault(kind, Counter())[domain] += 1
    total = sum(int(sizes[2 * i + 1]) for i in range(len(shards)))
    return Waiting(sorted(due), {k: dict(v) for k, v in held.items()}, total)


def _bucket_ends(n: int) -> list[int]:
    """The last rank of each of (at most) SAMPLES buckets of a set of *n* members."""
    if n <= SAMPLES:
        return list(range(n))
    step = -(-n // SAMPLES)
    return [min(n, start + step) - 1 for start in range(0, n, step)]


@dataclass(frozen=True)
class Eta:
    """When the crawl can be done at its recent pace, counting delayed work by due time."""

    #: seconds from now; None when unknown (nothing acked in the window, work left)
    seconds: float | None
    #: the latest due time of delayed work (server ms; None: nothing delayed)
    last_due_ms: int | None = None
    #: work left: pending + leased + delayed
    left: int = 0


def eta(stats: CrawlStats, waiting: Waiting, minutes: int = ETA_WINDOW) -> Eta:
    """The time to finish, as one server processing at the ack rate of the last *minutes*
    would (of the minutes since the first ack, for a crawl younger than that): work
    available now starts now, work due later not before its due time, so the end is the
    latest of ``t + (work due at t or after) / rate`` over now and each due time. 0.0 when
    nothing is left."""
    left = stats.pending + stats.leased + waiting.delayed
    last = waiting.last_due_ms
    if not left:
        return Eta(0.0, last, 0)
    first = min(stats.minutes.get("acked", {}), default=None)
    if first is not None:
        minutes = max(1, min(minutes, stats.now_ms // MINUTE_MS - first + 1))
    per_ms = stats.rate("acked", minutes) / 60_000
    if not per_ms:
        return Eta(None, last, left)
    now = stats.now_ms
    end = now + left / per_ms
    after = 0  # delayed work due at a sample's time or later, latest first
    for due, n in reversed(waiting.due):
        after += n
        if due > now:
            end = max(end, due + after / per_ms)
    return Eta((end - now) / 1000, last, left)
