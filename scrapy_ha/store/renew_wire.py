"""The arguments and the reply of ``renew.lua``: what a worker's lease keeper sends and
reads back (:mod:`scrapy_ha.scheduler.session.keeper`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from scrapy_ha.store.wire import text as _s

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["live_workers", "lost_pairs", "renew_args", "worker_stats"]


def renew_args(
    pairs: Iterable[tuple[str, str]],
    handed: Iterable[tuple[str, str]],
    *,
    worker: str,
    lease_ms: int,
    heartbeat_ms: int,
    stats: str,
) -> list[Any]:
    """The ARGV of renew.lua: the *handed* pairs (requests given to the engine: only their
    expiry counts toward poison) first, counted, then the worker's *stats* (see
    worker_stats), then the rest of *pairs*."""
    first = list(dict.fromkeys(handed))
    seen = set(first)  # built once: a renewal carries every held pair
    rest = [pair for pair in dict.fromkeys(pairs) if pair not in seen]
    args: list[Any] = [lease_ms, worker, heartbeat_ms, len(first), stats]
    for entry_id, token in first + rest:
        args += [entry_id, token]
    return args


def lost_pairs(reply: list[Any]) -> list[tuple[str, str]]:
    """The (entry id, token) pairs a renew.lua reply reports lost."""
    return [(_s(reply[i]), _s(reply[i + 1])) for i in range(3, len(reply) - 1, 2)]


def live_workers(reply: list[Any]) -> int:
    """The live workers a renew.lua reply counts (the renewing one included)."""
    return int(reply[2])


def worker_stats(leases: int, rate: float | None, every: float | None = None) -> str:
    """What a renewal publishes of its worker for ``scrapy-ha workers`` (renew.lua puts the
    time in front): leases held, pages done per second (None: not measured yet, left out,
    so that a worker that has just started is not shown at 0 pages/s), and the seconds
    between two of its renewals at most (its ``HA_LEASE_RENEW_INTERVAL``: past twice that,
    it is silent)."""
    doc: dict[str, float] = {"leases": leases}
    if rate is not None:
        doc["rate"] = round(rate, 2)
    if every is not None:
        doc["every"] = every
    return json.dumps(doc)
