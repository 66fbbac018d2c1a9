"""Crawl-wide numbers, read from Redis: what every worker of a crawl did, counted once.

The counters are kept by the Lua scripts that make the transitions (enqueue, ack, retry,
dead-letter, reclaim, requeue, purge), in the same call, so they cost no round trip and
never disagree with the queue: a counter moves exactly when its transition happens. Times
are the Redis server's. The keys (see :mod:`scrapy_ha.keys`):

- ``stats``: counters that only ever increase (``enqueued``, ``acked``, ``dead:<class>``...);
- ``stats:min``: per-minute buckets ``<event>:<minute>`` of ``acked``, ``enqueued``,
  ``retried``, ``dead``, ``requeued`` and ``purged``, and of ``retried:<class>`` and
  ``dead:<class>``, kept for a day, for rates and charts;
- ``stats:domain``: ``<domain>\\t<event>`` counts of ``enqueued``, ``acked``, ``retried``
  and ``dead``.

:func:`read_crawl_stats` (a sync redis client) and :func:`read_crawl_stats_async`
(redis.asyncio) read all of it, with the live size of each state, in one pipeline; the
per-domain counts after it, by ``HSCAN`` (:data:`DOMAIN_SCAN`).
"""

from __future__ import annotations

__all__ = [
    "COUNTERS",
    "DOMAIN_EVENTS",
    "MINUTE_EVENTS",
    "CrawlStats",
    "read_crawl_stats",
    "read_crawl_stats_async",
]

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis.exceptions

from scrapy_ha.ops.pipes import pipeline_of
from scrapy_ha.ops.unreadable import UNREADABLE, explain, explain_sync
from scrapy_ha.store import scripts
from scrapy_ha.store.script_keys import counts_keys
from scrapy_ha.store.sharding import layout_keys
from scrapy_ha.store.wire import Counts
from scrapy_ha.store.wire import text as _s

if TYPE_CHECKING:
    from scrapy_ha.keys import Keys

#: The counters of the ``stats`` hash, besides ``retried:<class>`` and ``dead:<class>``.
COUNTERS = (
    "enqueued",
    "filtered",
    "start_duplicates",
    "acked",
    "reclaimed",
    "poison",
    "retried",
    "dead",
    "retry_ok",
    "retry_dead",
    "requeued",
    "purged",
)
#: Events with per-minute buckets (``stats:min``).
MINUTE_EVENTS = ("acked", "enqueued", "retried", "dead")
#: Events counted per domain (``stats:domain``).
DOMAIN_EVENTS = ("enqueued", "acked", "retried", "dead")
#: A minute, in the server's milliseconds: bucket ``m`` holds the events of
#: ``m * 60000 <= t < (m + 1) * 60000``.
MINUTE_MS = 60_000
#: How long buckets are kept (a day): the longest rate window that can be asked for.
MINUTES_KEPT = 1440


#: The counters Redis keeps are 64-bit (HINCRBY refuses to go past them).
_INT64 = range(-(2**63), 2**63)


def counters(raw: dict[Any, Any]) -> dict[str, int]:
    """A hash of counters read with HGETALL, values as integers: a value that is not one,
    is past what Redis counts to (written by hand: 400 digits failed every chart and the
    exporter's whole page, for every crawl), or is below 0 (no count goes down: ``retried
    -5`` in ``status``, a Prometheus counter below 0), is skipped."""
    out = {}
    for k, v in raw.items():
        try:
            n = int(v)
        except ValueError:
            continue
        if 0 <= n < _INT64.stop:
            out[_s(k)] = n
    return out


@dataclass(frozen=True)
class CrawlStats(Counts):
    """The numbers of one crawl (``spider``) at one instant (Redis server time ``now_ms``).

    The live state, as :class:`~scrapy_ha.store.wire.Counts` (the same script reads it):
    ``pending``, ``leased``, ``delayed``, ``dead`` (entries in the dead-letter queue now),
    ``workers`` (alive), ``fingerprints``. The counters since the crawl began:
    :attr:`counters` (the ``stats`` hash as read) and the properties below.
    """

    spider: str
    counters: dict[str, int] = field(default_factory=dict)
    #: event -> minute -> count
    minutes: dict[str, dict[int, int]] = field(default_factory=dict)
    #: domain -> event -> count
    domains: dict[str, dict[str, int]] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        spider: str,
        counts: Counts,
        *,
        counters: dict[str, int],
        minutes: dict[str, dict[int, int]] | None = None,
        domains: dict[str, dict[str, int]] | None = None,
    ) -> CrawlStats:
        """The numbers of *spider*'s crawl: its live *counts* and its counters."""
        c = counts
        return cls(
            *(c.now_ms, c.pending, c.leased, c.delayed, c.dead, c.workers, c.fingerprints),
            spider=spider,
            counters=counters,
            minutes=minutes or {},
            domains=domains or {},
        )

    def counter(self, name: str) -> int:
        """Counter *name* of the ``stats`` hash (0 when it never moved)."""
        return self.counters.get(name, 0)

    @property
    def enqueued(self) -> int:
        return self.counter("enqueued")

    @property
    def filtered(self) -> int:
        return self.counter("filtered")

    @property
    def start_duplicates(self) -> int:
        """Requests with no parent page (start requests, pushed ones) the crawl had queued
        already: a second worker's start requests; ``filtered`` counts the links of pages."""
        return self.counter("start_duplicates")

    @property
    def acked(self) -> int:
        return self.counter("acked")

    @property
    def reclaimed(self) -> int:
        return self.counter("reclaimed")

    @property
    def poison(self) -> int:
        return self.counter("poison")

    @property
    def retried(self) -> int:
        return self.counter("retried")

    @property
    def dead_lettered(self) -> int:
        """Requests dead-lettered since the crawl began (``dead`` is the queue's size now)."""
        return self.counter("dead")

    @property
    def retry_ok(self) -> int:
        return self.counter("retry_ok")

    @property
    def retry_dead(self) -> int:
        return self.counter("retry_dead")

    @property
    def requeued(self) -> int:
        return self.counter("requeued")

    @property
    def purged(self) -> int:
        return self.counter("purged")

    def _per_class(self, event: str) -> dict[str, int]:
        prefix = f"{event}:"
        return {
            k[len(prefix) :]: v for k, v in sorted(self.counters.items()) if k.startswith(prefix)
        }

    @property
    def retried_by_class(self) -> dict[str, int]:
        """Retries per failure class (``server``, ``timeout``, ...)."""
        return self._per_class("retried")

    @property
    def dead_by_class(self) -> dict[str, int]:
        """Dead letters per failure class (``gone``, ``banned``, ``poison``, ...)."""
        return self._per_class("dead")

    @property
    def retry_success_rate(self) -> float | None:
        """Of the retried requests that ended, the share that succeeded (None: none ended)."""
        ended = self.retry_ok + self.retry_dead
        return self.retry_ok / ended if ended else None

    def rate(self, event: str, minutes: int) -> float:
        """Events per minute over the last *minutes* minutes, from the per-minute buckets.

        The window ends now: the current minute's bucket counts whole, the bucket the window
        starts in counts for the part of it inside the window (events are taken as spread
        evenly over their minute), so the rate moves smoothly from one second to the next."""
        buckets = self.minutes.get(event, {})
        now_minute, into = divmod(self.now_ms, MINUTE_MS)
        first = now_minute - minutes + 1
        total: float = sum(n for m, n in buckets.items() if first <= m <= now_minute)
        total += buckets.get(first - 1, 0) * (1 - into / MINUTE_MS)
        return total / minutes

    def eta_seconds(self, minutes: int = 5) -> float | None:
        """Seconds until the active requests are done at the ack rate of the last *minutes*
        (None when nothing was acked in that time, 0.0 when nothing is left)."""
        if not self.active:
            return 0.0
        rate = self.rate("acked", minutes)
        return self.active / rate * 60 if rate else None

    def top_domains(self, n: int = 10, by: str = "acked") -> list[tuple[str, dict[str, int]]]:
        """The *n* domains with the most *by* events, most first."""
        ranked = sorted(self.domains.items(), key=lambda kv: (-kv[1].get(by, 0), kv[0]))
        return ranked[:n]


#: Fields of ``stats:domain`` read per ``HSCAN`` call. The hash holds 4 fields a domain: one
#: ``HGETALL`` of a broad crawl's (10,000 domains) held Redis, and every worker's call, for
#: 100 ms at each ``status`` and crawl page (a QA run); 1,000 fields are about 1 ms of it.
DOMAIN_SCAN = 1000


def _queue_reads(pipe: Any, keys: Keys) -> None:
    states = counts_keys(keys)
    pipe.eval(scripts.COUNTS_LUA, len(states), *states, "strict")  # (garbage named)
    pipe.hgetall(keys.stats)
    pipe.hgetall(keys.stats_minutes)


def _minutes(raw: dict[Any, Any]) -> dict[str, dict[int, int]]:
    out: dict[str, dict[int, int]] = {}
    for name, count in counters(raw).items():
        event, _, minute = name.rpartition(":")
        if minute.isdigit():  # skips <event>:last
            out.setdefault(event, {})[int(minute)] = count
    return out


def _domains(raw: dict[Any, Any]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for name, count in counters(raw).items():
        domain, _, event = name.rpartition("\t")
        out.setdefault(domain, {})[event] = count
    return out


def _parse(keys: Keys, replies: list[Any], domains: dict[Any, Any]) -> CrawlStats:
    return CrawlStats.of(
        keys.spider,
        Counts.from_reply(replies[0]),
        counters=counters(replies[1]),
        minutes=_minutes(replies[2]),
        domains=_domains(domains),
    )


def read_crawl_stats(client: Any, keys: Keys, *, domains: bool = True) -> CrawlStats:
    """The numbers of one crawl, with a sync ``redis.Redis`` client (one round trip; one
    more for a sharded crawl, whose shards are summed: see :func:`merge_stats`).

    *domains* False skips the per-domain counts (large for a broad crawl). A key of the
    crawl of another type raises :class:`~scrapy_ha.ops.unreadable.CrawlUnreadable`,
    which names it."""
    try:
        return _read_crawl_stats(client, keys, domains)
    except redis.exceptions.NoPermissionError:
        raise  # this user's ACL, not the crawl's keys: the command names the URL
    except UNREADABLE as exc:
        raise explain_sync(client, keys.prefix, keys.spider, exc) from None


def _read_crawl_stats(client: Any, keys: Keys, domains: bool) -> CrawlStats:
    pipe = pipeline_of(client)
    _queue_reads(pipe, keys)
    pipe.get(keys.shard_count)
    replies = pipe.execute()
    sharded = _sharded(keys, replies.pop())
    if sharded is None:
        return _parse(keys, replies, _scan_domains(client, keys) if domains else {})
    pipe = pipeline_of(client)
    for shard in sharded:
        _queue_reads(pipe, shard)
    read = [_scan_domains(client, shard) if domains else {} for shard in sharded]
    return merge_stats(_per_shard(sharded, pipe.execute(), read))


def _scan_domains(client: Any, keys: Keys) -> dict[Any, Any]:
    """The per-domain counts of one shard, :data:`DOMAIN_SCAN` fields a call."""
    return dict(client.hscan_iter(keys.stats_domains, count=DOMAIN_SCAN))


async def _scan_domains_async(client: Any, keys: Keys) -> dict[Any, Any]:
    return {f: n async for f, n in client.hscan_iter(keys.stats_domains, count=DOMAIN_SCAN)}


async def read_crawl_stats_async(client: Any, keys: Keys, *, domains: bool = True) -> CrawlStats:
    """:func:`read_crawl_stats` with a ``redis.asyncio.Redis`` client."""
    try:
        return await _read_crawl_stats_async(client, keys, domains)
    except redis.exceptions.NoPermissionError:
        raise  # this user's ACL, not the crawl's keys: the command names the URL
    except UNREADABLE as exc:
        raise await explain(client, keys.prefix, keys.spider, exc) from None


async def _read_crawl_stats_async(client: Any, keys: Keys, domains: bool) -> CrawlStats:
    pipe = client.pipeline(transaction=False)
    _queue_reads(pipe, keys)
    pipe.get(keys.shard_count)
    replies = await pipe.execute()
    sharded = _sharded(keys, replies.pop())
    if sharded is None:
        return _parse(keys, replies, await _scan_domains_async(client, keys) if domains else {})
    pipe = client.pipeline(transaction=False)
    for shard in sharded:
        _queue_reads(pipe, shard)
    replies = await pipe.execute()
    read = [await _scan_domains_async(client, shard) if domains else {} for shard in sharded]
    return merge_stats(_per_shard(sharded, replies, read))


def _sharded(keys: Keys, stored: Any) -> list[Keys] | None:
    """The keys of every shard when the crawl is sharded (its layout is in Redis)."""
    base = layout_keys(keys.prefix, keys.spider, stored)
    return None if base.shard is None else base.every_shard()


def _per_shard(
    shards: list[Keys], replies: list[Any], domains: list[dict[Any, Any]]
) -> list[CrawlStats]:
    return [_parse(k, replies[i * 3 : (i + 1) * 3], domains[i]) for i, k in enumerate(shards)]


def merge_stats(parts: list[CrawlStats]) -> CrawlStats:
    """The numbers of a sharded crawl: every shard's summed; time and live workers are
    shard 0's (every worker heartbeats there)."""
    first = parts[0]
    counts = Counts(
        first.now_ms,
        pending=sum(p.pending for p in parts),
        leased=sum(p.leased for p in parts),
        delayed=sum(p.delayed for p in parts),
        dead=sum(p.dead for p in parts),
        workers=first.workers,
        fingerprints=sum(p.fingerprints for p in parts),
    )
    total = CrawlStats.of(first.spider, counts, counters={})
    for part in parts:
        for name, count in part.counters.items():
            total.counters[name] = total.counters.get(name, 0) + count
        for event, buckets in part.minutes.items():
            per_minute = total.minutes.setdefault(event, {})
            for minute, count in buckets.items():
                per_minute[minute] = per_minute.get(minute, 0) + count
        for domain, events in part.domains.items():
            per_event = total.domains.setdefault(domain, {})
            for name, count in events.items():
                per_event[name] = per_event.get(name, 0) + count
    return total
