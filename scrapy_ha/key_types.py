"""The Redis type each key of a crawl must have: a key of another type is garbage that
``set_aside_wrong_types`` renames (the keys: :class:`scrapy_ha.keys.Keys`)."""

from __future__ import annotations

__all__ = ["key_types"]

from typing import Any


def key_types(keys: Any) -> dict[str, str]:
    """The Redis type each of *keys*' keys (a :class:`~scrapy_ha.keys.Keys`; not imported
    here: it imports this) must have (a key of another type is set aside)."""
    zsets = [keys.ready, keys.waiting, keys.legacy_pending, keys.leased, keys.delayed]
    zsets += [keys.dead, keys.workers, keys.seen, keys.revisits, keys.gate_log]
    strings = [keys.seq, keys.lease_seq, keys.reclaim_guard, keys.paused, keys.pressure]
    strings += [keys.dlq_alert, keys.stop, keys.queued, keys.feed_guard]
    types = {key: "hash" for key in keys.all()}
    types.update({key: "zset" for key in zsets})
    types.update({key: "string" for key in strings})
    types[keys.dupefilter] = "set"
    types.update(dict.fromkeys((keys.items, keys.items_aside), "stream"))
    types.update({key: "set" for key in keys.aged_slices()})
    return types
