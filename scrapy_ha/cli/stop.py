"""``scrapy-ha stop SPIDER``: close every worker of a crawl that runs now.

A continuous crawl (revisits) never finishes by itself. ``stop`` writes the time of the
stop in the crawl's ``stop`` key; each worker that joined the crawl before that time reads
it within ``HA_LEASE_RENEW_INTERVAL`` and closes its spider (finish reason ``stopped``) as
Ctrl-C does: it finishes what is in its engine and gives its leases back. The queue stays
in Redis (revisits and all); a worker started after the stop runs, and resumes the crawl.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy_ha.ops.display import local_time
from scrapy_ha.ops.operations import server_ms

if TYPE_CHECKING:
    import argparse

    from scrapy_ha.store.queue import RedisQueue


async def stop(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Close every worker of the crawl that runs now (within HA_LEASE_RENEW_INTERVAL); the
    queue stays in Redis, and workers started later run."""
    at = await server_ms(queue.client)
    await queue.client.set(queue.keys.stop, at)
    live = int(await queue.client.zcount(queue.keys.workers, at, "+inf"))
    print(
        f"{queue.keys.spider}: stop asked at {local_time(at)}: {live} live worker(s) close "
        "within HA_LEASE_RENEW_INTERVAL, giving back what they hold; workers started from "
        "now on run"
    )
    return 0
