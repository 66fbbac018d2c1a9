"""Revisits in Redis (``lua/revisit.lua``): a finished request's lease ends by sending it
back to the delayed set, due again after its interval, instead of an ack (what the
operator's tools read of them: :mod:`scrapy_ha.ops.revisits`).

A revisited request keeps its entry id and its place in the order for the life of the
crawl; one entry revisits a URL (``lua/lib/revisit.lua``), and a URL revisited is seen
again at each visit, so a page that links to it queues no second copy (with
``HA_DUPEFILTER_TTL``, while the last visit is not older than the TTL; a copy queued later
is fetched and ends as a double). The crawl then always holds a request
in the delayed set: it never finishes by itself (``scrapy-ha stop``, ``pause`` or a signal
end it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy_ha.store import scripts
from scrapy_ha.store.bloom import seen_call
from scrapy_ha.store.script_keys import frontier_keys
from scrapy_ha.store.wire import packed_acks

if TYPE_CHECKING:
    from scrapy_ha.store.queue import RedisQueue
    from scrapy_ha.store.wire import Commit

__all__ = ["DOUBLE", "LEFT", "Revisit", "Revisited", "revisit"]

#: What :func:`revisit` returns for a double: another entry revisits the URL (this one's
#: lease ended as an ack).
DOUBLE = -1
#: What :func:`revisit` returns for an entry that leaves the revisits (a negative
#: interval: no longer revisited; its lease ended as an ack, its share of the budget out).
LEFT = -2
#: The numbers of :attr:`Revisit.allocation` (``lua/revisit.lua``'s ARGV[8] to ARGV[15]).
ALLOCATION_ARGS = 8


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
    #: adaptive revisits (:mod:`scrapy_ha.config.freshness`): what the visit changes of the
    #: crawl's sums (visits a second: its ``1 / interval`` less its last's; the configured
    #: interval's at its first visit), the budget (0: that configured sum), the multiplier
    #: to start from, what the entry holds in the two sums (taken out of them if it is a
    #: double), and the range the multiplier is kept in (``multiplier_range``); every one
    #: finite (Redis refuses the revisit otherwise, before it changes anything); None:
    #: fixed revisits, nothing kept
    allocation: tuple[float, ...] | None = None
    #: the URL is recorded as seen again in the dupefilter (False: the crawl does not
    #: deduplicate; its fingerprint still keeps one revisit entry per URL)
    seen: bool = True
    #: the priority of the next visit (None: its lease's): the request's own, without the
    #: lowering of this visit's retries, which would otherwise stay for every visit after
    priority: int | None = None


@dataclass(frozen=True)
class Revisited:
    """What a revisit did: the due time of the next visit (server ms; 0: the token was
    stale, nothing changed; :data:`DOUBLE`), what the page committed with it, and the
    crawl's multiplier after it (0.0: fixed revisits, or nothing changed)."""

    due: int
    items: int = 0
    checkpoints: int = 0
    multiplier: float = 0.0


async def revisit(queue: RedisQueue, visit: Revisit, commit: Commit | None = None) -> Revisited:
    """End *visit*'s lease as a revisit, committing what the page yielded (*commit*: its
    items and its task's checkpoint, with ``HA_ITEMS = "outbox"``) as an ack would."""
    k = queue.keys
    keys = [k.leased, k.leases, k.delayed, k.delayed_score, k.payload, k.retried, k.expiries]
    keys += [*k.stats_keys(), k.polite, k.revisits, k.revisit_urls, k.items, k.held]
    keys += [queue.dupefilter.key(k), k.revisit_alloc, *frontier_keys(k), k.dead]
    pair = (visit.entry_id, visit.token)
    commits = {pair: commit} if commit is not None else {}
    task_keys = lambda task: (k.checkpoint(task), k.checkpoint_ahead(task))  # noqa: E731
    (ack,), more = packed_acks([pair], commits, task_keys, len(keys) + 1)
    fingerprint = queue.dupefilter.wire(visit.fingerprint)
    args = [ack, visit.interval_ms, visit.payload, fingerprint, visit.found]
    args += [visit.saved, visit.bucket, *_allocation_args(visit.allocation)]
    args += ["1" if visit.seen else "0", queue.order_arg]
    args += ["" if visit.priority is None else visit.priority]
    script = queue.client.register_script(scripts.REVISIT_LUA)
    reply = await seen_call(script, queue.dupefilter, k, call_keys=[*keys, *more], args=args)
    due, items, checkpoints = (int(x) for x in reply[:3])
    multiplier = float(reply[3]) if len(reply) > 3 and reply[3] else 0.0
    return Revisited(due, items, checkpoints, multiplier)


def _allocation_args(allocation: tuple[float, ...] | None) -> list[str]:
    if allocation is None:
        return [""] * ALLOCATION_ARGS
    return [repr(float(x)) for x in allocation]
