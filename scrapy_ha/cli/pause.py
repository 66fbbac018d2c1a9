"""``scrapy-ha pause SPIDER`` / ``resume SPIDER``: hold a crawl without stopping its workers.

Pausing sets the crawl's ``paused`` key. Workers read it in the sync they make anyway: while
it is set, Redis leases them nothing; each finishes and acks what it holds, keeps its
heartbeat, logs "crawl paused by operator" once at INFO, and stays open (a paused crawl is
not finished). Resuming deletes the key: workers lease again at their next sync.
"""

from __future__ import annotations

import getpass
import json
import socket
from typing import TYPE_CHECKING

from scrapy_ha.ops import operations
from scrapy_ha.ops.display import local_time

if TYPE_CHECKING:
    import argparse

    from scrapy_ha.store.queue import RedisQueue


async def pause(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Workers lease nothing new: they finish what they hold, keep their leases renewed and
    stay open until `resume`."""
    fresh = await operations.pause(queue, by=f"{getpass.getuser()}@{socket.gethostname()}")
    since = await paused_since(queue)
    state = "paused" if fresh else "already paused"
    print(
        f"{queue.keys.spider} {state} since {since}: workers lease nothing new and finish what "
        f"they hold (`scrapy-ha resume {queue.keys.spider}` to go on)"
    )
    return 0


async def resume(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Workers lease again at their next sync."""
    if await operations.resume(queue):
        print(f"{queue.keys.spider} resumed: workers lease again")
    else:
        print(f"{queue.keys.spider} was not paused")
    return 0


async def paused_since(queue: RedisQueue) -> str | None:
    """When and by whom the crawl was paused (None: it is not)."""
    raw = await queue.client.get(queue.keys.paused)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
        return f"{local_time(int(doc['at']))} (by {doc['by']})"
    except (ValueError, KeyError, TypeError):
        return "an unknown time"
