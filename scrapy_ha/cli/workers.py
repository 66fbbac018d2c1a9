"""``scrapy-ha workers SPIDER``: every live worker of a crawl and what it is doing (see
:mod:`scrapy_ha.ops.workers`): the last heartbeat shown is its last lease renewal."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from scrapy_ha.cli.pause import paused_since
from scrapy_ha.ops.display import humanize
from scrapy_ha.ops.workers import live_workers

if TYPE_CHECKING:
    import argparse

    from scrapy_ha.store.queue import RedisQueue


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
    rows = [(w, w.as_dict(now)) for w in found]
    # as wide as what they show: a scrapyd job id is 32 characters (a QA run: the table's
    # columns went out of line under scrapyd, the very case the JOB column is for)
    host = max(20, *(len(w.host) for w in found))
    job = max(14, *(len(w.job) for w in found))
    print(
        f"{'HOST':<{host}} {'PID':>7}  {'JOB':<{job}} {'HEARTBEAT':<19} {'AGO':>8} "
        f"{'LEASES':>6} {'PAGES/S':>7}  WORKER"
    )
    for w, row in rows:
        age = row["heartbeat_age_s"]
        print(
            f"{w.host:<{host}} {w.pid:>7}  {w.job:<{job}} {row['heartbeat'] or '-':<19} "
            f"{humanize(age) if age is not None else '-':>8} {_num(row['leases']):>6} "
            f"{_num(row['pages_per_s']):>7}  {w.id}"
        )
    print(f"{len(found)} live worker{'' if len(found) == 1 else 's'}")
    for w in (w for w in found if w.silent(now)):
        print(
            f"{w.id} has been silent for {humanize((now - w.stats['at']) / 1000)}: killed or "
            f"stalled? It counts as live until its heartbeat expires in "
            f"{humanize(max(0, w.expires_ms - now) / 1000)}; its leases then go back to the queue"
        )
    since = await paused_since(queue)
    if since:
        print(f"the crawl is paused since {since}: they lease nothing new")
    return 0


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:g}"
