"""A crawl's live workers as Redis knows them: each lease renewal publishes the worker's
leases held and pages per second in the ``wstats`` hash, with the time of that renewal.

A worker id is ``host:pid[:job]:random`` (``HA_WORKER_ID`` overrides it: such an id is
shown as it is).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_ha.ops.display import local_time, time_ms
from scrapy_ha.ops.operations import server_ms
from scrapy_ha.store.wire import text as _s

if TYPE_CHECKING:
    from scrapy_ha.store.queue import RedisQueue

__all__ = ["Worker", "live_workers"]

#: Parts of a worker id scrapy-ha makes at least: host, pid, random (the scrapyd job, when
#: there is one, comes before the random part and may hold colons of its own: scrapyd takes
#: any ``jobid`` it is given).
MIN_ID_PARTS = 3


@dataclass(frozen=True)
class Worker:
    """One live worker as ``scrapy-ha workers`` shows it."""

    id: str
    host: str
    pid: str
    job: str
    expires_ms: int
    stats: dict[str, Any]

    @classmethod
    def parse(cls, worker_id: str, expires_ms: int, stats: dict[str, Any]) -> Worker:
        parts = worker_id.split(":")
        if len(parts) < MIN_ID_PARTS or not parts[1].isdigit():
            return cls(worker_id, "-", "-", "-", expires_ms, stats)
        job = ":".join(parts[2:-1]) or "-"
        return cls(worker_id, parts[0], parts[1], job, expires_ms, stats)

    def as_dict(self, now_ms: int) -> dict[str, Any]:
        """The worker as ``workers --json`` and the dashboard's API give it: ``pid`` a number;
        host, pid and job null where the id has none (a job: a worker outside scrapyd; all
        three: a worker id of the user's own, ``HA_WORKER_ID``)."""
        at = self.stats.get("at")
        return {
            "id": self.id,
            "host": None if self.host == "-" else self.host,
            "pid": int(self.pid) if self.pid.isdigit() else None,
            "job": None if self.job == "-" else self.job,
            "heartbeat": local_time(at) if isinstance(at, int) else None,
            "heartbeat_age_s": (now_ms - at) / 1000 if isinstance(at, int) else None,
            "leases": _number(self.stats.get("leases")),
            "pages_per_s": _number(self.stats.get("rate")),
            "silent": self.silent(now_ms),
        }

    def silent(self, now_ms: int) -> bool:
        """Whether its last heartbeat is older than twice the longest time between two of
        its renewals (``every``: 20 s by default), or, from a worker that does not say it,
        two thirds of the life a heartbeat gives it: killed or stalled, though counted live
        until the heartbeat expires."""
        at, every = self.stats.get("at"), _number(self.stats.get("every"))
        if not isinstance(at, int):
            return False
        if every is not None and every > 0:
            return now_ms - at > 2 * every * 1000
        return now_ms - at > (self.expires_ms - at) * 2 / 3


async def live_workers(queue: RedisQueue) -> tuple[int, list[Worker]]:
    """(Redis time in ms, the workers whose heartbeat has not expired), oldest first."""
    now = await server_ms(queue.client)
    keys = queue.keys
    rows = await queue.client.zrangebyscore(keys.workers, now, "+inf", withscores=True)
    ids = [_s(member) for member, _ in rows]
    stats = await queue.client.hmget(keys.worker_stats, ids) if ids else []
    return now, [
        Worker.parse(worker_id, int(min(expiry, MAX_MS)), _stats(raw))  # `inf`: by hand
        for (_, expiry), worker_id, raw in zip(rows, ids, stats, strict=True)
    ]


#: The latest heartbeat expiry shown (a score written by hand may be ``inf``).
MAX_MS = 2**53


def _number(value: Any) -> float | int | None:
    """A figure a renewal published; anything else (written by hand) is none."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return value if ok and math.isfinite(value) else None


def _stats(raw: bytes | None) -> dict[str, Any]:
    """``"<renewal time, ms> <JSON>"`` (see renew.lua) -> the JSON object with ``at``."""
    at, _, doc = (raw or b"").partition(b" ")
    try:
        stats = json.loads(doc)
    except ValueError:
        return {}
    ok = isinstance(stats, dict) and at.isdigit()
    return {**stats, "at": time_ms(at)} if ok else {}  # (a time past 9999 by hand: clamped)
