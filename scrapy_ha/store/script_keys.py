"""The KEYS of each Lua script, in the order its header lists them: one place per script,
so that the wrapper (:mod:`scrapy_ha.store.queue`), the operator's tools and the benchmarks
pass a script the same keys. Every name comes from :class:`~scrapy_ha.keys.Keys`."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy_ha.keys import Keys

__all__ = [
    "counts_keys",
    "dead_keys",
    "feed_keys",
    "convert_keys",
    "frontier_keys",
    "reclaim_keys",
    "release_keys",
    "requeue_keys",
    "retry_keys",
    "sync_keys",
]


def frontier_keys(k: Keys) -> list[str]:
    """The back queues' prefix, ready, waiting and queued (``lua/lib/frontier.lua``)."""
    return [k.queues, k.ready, k.waiting, k.queued]


def sync_keys(k: Keys, dupefilter: str, worker: str | None = None) -> list[str]:
    """``sync.lua``'s fixed keys (*dupefilter*: the exact set or the Bloom filter's meta
    hash): with *worker*, its grant key last. The checkpoint keys its acks name and the
    Bloom filter's bitmaps follow them. Built once per crawl and worker, not per round (27
    names, each a formatted string)."""
    return list(_sync_keys(k, dupefilter, worker))


@functools.lru_cache(maxsize=64)
def _sync_keys(k: Keys, dupefilter: str, worker: str | None) -> tuple[str, ...]:
    keys = [k.queues, k.payload, dupefilter, k.seq, k.leased, k.leases, k.expiries]
    keys += [k.delayed, k.delayed_score, k.lease_seq, k.gates, k.dead, k.dead_info]
    keys += [*k.stats_keys(), k.retried, k.paused, k.sent, k.domain_limits, k.polite]
    keys += [k.ready, k.waiting, k.queued, k.held, k.items, k.gate_log]
    return tuple(keys if worker is None else [*keys, k.grant(worker)])


def reclaim_keys(k: Keys) -> list[str]:
    keys = [k.leased, k.leases, k.queues, k.expiries, k.dead, k.dead_info, k.reclaim_guard]
    keys += [k.payload, k.retried, *k.stats_keys(), k.dead_archived, k.polite]
    tail = [k.revisits, k.revisit_alloc, k.revisit_urls, k.delayed]
    return [*keys, k.ready, k.waiting, k.queued, *tail]


def release_keys(k: Keys) -> list[str]:
    return [k.queues, k.leased, k.leases, k.payload, k.polite, k.ready, k.waiting, k.queued]


def dead_keys(k: Keys) -> list[str]:
    keys = [k.leased, k.leases, k.dead, k.dead_info, k.expiries, k.payload, k.retried]
    tail = [k.dead_archived, k.polite, *frontier_keys(k), k.revisit_alloc, k.revisits]
    return [*keys, *k.stats_keys(), *tail, k.revisit_urls]


def retry_keys(k: Keys) -> list[str]:
    keys = [k.leased, k.leases, k.delayed, k.delayed_score, k.payload, k.retried]
    return [*keys, *k.stats_keys(), k.polite, *frontier_keys(k), k.held]


def requeue_keys(k: Keys) -> list[str]:
    keys = [k.dead, k.dead_info, k.queues, k.payload, k.seq, k.expiries, *k.stats_keys()]
    return [*keys, k.ready, k.waiting, k.queued, k.revisit_alloc, k.revisits, k.revisit_urls]


def feed_keys(k: Keys, start_key: str, dupefilter: str) -> list[str]:
    """``feed.lua``'s keys (*dupefilter*: the exact set or the Bloom filter's meta hash);
    the Bloom filter's bitmaps follow them."""
    keys = [start_key, k.queues, k.payload, dupefilter, k.seq, *k.stats_keys()]
    return [*keys, k.ready, k.waiting, k.queued]


def counts_keys(k: Keys) -> list[str]:
    """``counts.lua``: the size of every state, the dupefilters (a crawl has one of them),
    the old pending sorted set, then the exact set's time slices (their hash, their sets)."""
    keys = [k.ready, k.waiting, k.queued, k.leased, k.delayed, k.dead, k.workers]
    return [*keys, k.dupefilter, k.bloom, k.legacy_pending, k.buckets, k.aged, *k.aged_slices()]


def convert_keys(k: Keys) -> list[str]:
    """``convert.lua``: the old pending sorted set, then the back queues' keys."""
    return [k.legacy_pending, k.queues, k.ready, k.waiting, k.queued]
