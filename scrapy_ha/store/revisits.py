"""Revisits in Redis (``lua/revisit.lua``): a finished request's lease ends by sending it
back to the delayed set, due again after its interval, instead of an ack; and what the
operator's tools read of them (due soon, what was found, the intervals).

A revisited request keeps its entry id and its place in the order for the life of the
crawl; one entry revisits a URL (``lua/lib/revisit.lua``), and a URL revisited stays seen,
so a page that links to it queues no second copy. The crawl then always holds a request
in the delayed set: it never finishes by itself (``scrapy-ha stop``, ``pause`` or a signal
end it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy_ha.store.bloom import seen_call
from scrapy_ha.store.scripts import REVISIT_LUA
from scrapy_ha.store.wire import packed_acks

if TYPE_CHECKING:
    from scrapy_ha.store.queue import RedisQueue
    from scrapy_ha.store.wire import Commit

__all__ = ["DOUBLE", "Revisit", "RevisitNumbers", "Revisited", "read_revisits", "revisit"]

#: What :func:`revisit` returns for a double: another entry revisits the URL (this one's
#: lease ended as an ack).
DOUBLE = -1
#: Seconds ahead that "due soon" counts (status, dashboard, metrics).
DUE_WINDOW = 3600


@dataclass(frozen=True)
class Revisit:
    """One revisit to record: what the visit found, the next interval, the new payload."""

    entry_id: str
    token: str
    interval_ms: int
    payload: bytes
    fingerprint: bytes
    found: str
    saved: int
    bucket: str


@dataclass(frozen=True)
class Revisited:
    """What a revisit did: the due time of the next visit (server ms; 0: the token was
    stale, nothing changed; :data:`DOUBLE`), and what the page committed with it."""

    due: int
    items: int = 0
    checkpoints: int = 0


async def revisit(queue: RedisQueue, visit: Revisit, commit: Commit | None = None) -> Revisited:
    """End *visit*'s lease as a revisit, committing what the page yielded (*commit*: its
    items and its task's checkpoint, with ``HA_ITEMS = "outbox"``) as an ack would."""
    k = queue.keys
    keys = [k.leased, k.leases, k.delayed, k.delayed_score, k.payload, k.retried, k.expiries]
    keys += [*k.stats_keys(), k.polite, k.revisits, k.revisit_urls, k.items]
    keys.append(queue.dupefilter.key(k))
    pair = (visit.entry_id, visit.token)
    commits = {pair: commit} if commit is not None else {}
    task_keys = lambda task: (k.checkpoint(task), k.checkpoint_ahead(task))  # noqa: E731
    (ack,), more = packed_acks([pair], commits, task_keys, len(keys) + 1)
    args = [ack, visit.interval_ms, visit.payload, visit.fingerprint, visit.found]
    args += [visit.saved, visit.bucket]
    script = queue.client.register_script(REVISIT_LUA)
    reply = await seen_call(script, queue.dupefilter, k, call_keys=[*keys, *more], args=args)
    return Revisited(*(int(x) for x in reply))


@dataclass(frozen=True)
class RevisitNumbers:
    """What a continuous crawl shows (``scrapy-ha status``, the dashboard, the metrics)."""

    #: revisited entries, and those due within :data:`DUE_WINDOW` seconds
    revisited: int = 0
    due_soon: int = 0
    #: visits by what they found (new, changed, unchanged, not_modified, unknown)
    found: dict[str, int] = field(default_factory=dict)
    #: bytes of the bodies 304 answers did not send again
    saved_bytes: int = 0
    #: revisits ended as doubles (another entry revisits the URL)
    doubles: int = 0
    #: intervals scheduled, by histogram bucket (seconds, or "inf")
    intervals: dict[str, int] = field(default_factory=dict)

    @property
    def change_rate(self) -> float | None:
        """Of the revisits that looked (not the first visits), the share that found the
        page changed; None before any."""
        looked = sum(self.found.get(f, 0) for f in ("changed", "unchanged", "not_modified"))
        return self.found.get("changed", 0) / looked if looked else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "revisited": self.revisited,
            "due_soon": self.due_soon,
            "found": self.found,
            "change_rate": self.change_rate,
            "saved_bytes": self.saved_bytes,
            "doubles": self.doubles,
            "intervals": self.intervals,
        }


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def read_revisits(client: Any, keys: Any, now_ms: int) -> RevisitNumbers:
    """The crawl's revisit numbers at server time *now_ms* (unsharded keys)."""
    stats = {_s(k): int(v) for k, v in (await client.hgetall(keys.stats)).items()}
    found = {k.split(":", 1)[1]: v for k, v in stats.items() if k.startswith("revisited:")}
    intervals = {k.split(":", 1)[1]: v for k, v in stats.items() if k.startswith("revisit_iv:")}
    soon = await client.zcount(keys.revisits, now_ms, now_ms + DUE_WINDOW * 1000)
    return RevisitNumbers(
        revisited=int(await client.zcard(keys.revisits)),
        due_soon=int(soon),
        found=found,
        saved_bytes=stats.get("revisit_saved", 0),
        doubles=stats.get("revisit_double", 0),
        intervals=intervals,
    )
