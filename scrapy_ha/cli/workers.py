"""``scrapy-ha workers SPIDER``: every live worker of a crawl and what it is doing.

A worker id is ``host:pid[:job]:random`` (``HA_WORKER_ID`` overrides it: such an id is
shown as it is). Each lease renewal publishes the worker's leases held and pages per second
in the ``wstats`` hash, with the time of that renewal: the last heartbeat shown.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_ha.cli.common import command, humanize, local_time
from scrapy_ha.cli.pause import paused_since
from scrapy_ha.ops.operations import server_ms

if TYPE_CHECKING:
    import argparse

    from scrapy_ha.store.queue import RedisQueue

#: Parts of a worker id scrapy-ha makes: host, pid, then the scrapyd job (optional), random.
ID_PARTS = (3, 4)


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
        if len(parts) not in ID_PARTS or not parts[1].isdigit():
            return cls(worker_id, "-", "-", "-", expires_ms, stats)
        job = parts[2] if len(parts) == max(ID_PARTS) else "-"
        return cls(worker_id, parts[0], parts[1], job, expires_ms, stats)

    def as_dict(self, now_ms: int) -> dict[str, Any]:
        at = self.stats.get("at")
        return {
            "id": self.id,
            "host": self.host,
            "pid": self.pid,
            "job": self.job,
            "heartbeat": local_time(at) if isinstance(at, int) else None,
            "heartbeat_age_s": (now_ms - at) / 1000 if isinstance(at, int) else None,
            "leases": self.stats.get("leases"),
            "pages_per_s": self.stats.get("rate"),
        }


async def live_workers(queue: RedisQueue) -> tuple[int, list[Worker]]:
    """(Redis time in ms, the workers whose heartbeat has not expired), oldest first."""
    now = await server_ms(queue.client)
    keys = queue.keys
    rows = await queue.client.zrangebyscore(keys.workers, now, "+inf", withscores=True)
    ids = [_s(member) for member, _ in rows]
    stats = await queue.client.hmget(keys.worker_stats, ids) if ids else []
    return now, [
        Worker.parse(worker_id, int(expiry), _stats(raw))
        for (_, expiry), worker_id, raw in zip(rows, ids, stats, strict=True)
    ]


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _stats(raw: bytes | None) -> dict[str, Any]:
    """``"<renewal time, ms> <JSON>"`` (see renew.lua) -> the JSON object with ``at``."""
    at, _, doc = (raw or b"").partition(b" ")
    try:
        stats = json.loads(doc)
    except ValueError:
        return {}
    return {**stats, "at": int(at)} if isinstance(stats, dict) and at.isdigit() else {}


async def workers(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Each live worker: host, pid, scrapyd job, last heartbeat (local time and age), leases
    held, pages/s."""
    now, found = await live_workers(queue)
    if args.json:
        print(json.dumps([w.as_dict(now) for w in found]))
        return 0
    if not found:
        print(f"no live worker of {queue.keys.spider}")
        return 0
    print(
        f"{'HOST':<20} {'PID':>7}  {'JOB':<14} {'HEARTBEAT':<19} {'AGO':>8} {'LEASES':>6} "
        f"{'PAGES/S':>7}  WORKER"
    )
    for w in found:
        row = w.as_dict(now)
        age = row["heartbeat_age_s"]
        print(
            f"{w.host:<20} {w.pid:>7}  {w.job:<14} {row['heartbeat'] or '-':<19} "
            f"{humanize(age) if age is not None else '-':>8} {_num(row['leases']):>6} "
            f"{_num(row['pages_per_s']):>7}  {w.id}"
        )
    print(f"{len(found)} live worker{'' if len(found) == 1 else 's'}")
    since = await paused_since(queue)
    if since:
        print(f"the crawl is paused since {since}: they lease nothing new")
    return 0


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:g}"


def register(sub: Any) -> None:
    """``workers SPIDER [--json]``."""
    command(sub, "workers", workers).add_argument(
        "--json", action="store_true", help="a JSON list, one object per worker"
    )
