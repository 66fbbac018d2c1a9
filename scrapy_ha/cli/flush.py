"""``scrapy-ha flush SPIDER``: delete every key of a crawl (refused while workers live)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from scrapy_ha.cli.common import approve

if TYPE_CHECKING:
    import argparse

    from scrapy_ha.store.queue import RedisQueue


async def flush(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Delete every key of the crawl (dead-letter queue included); refuses while workers live."""
    counts = await queue.counts()
    if counts.workers and not args.force:
        print(
            f"{counts.workers} worker(s) of {queue.keys.spider} are alive: stop them first, "
            f"or pass --force",
            file=sys.stderr,
        )
        return 1
    held = [f"{name}: {n}" for name, n in counts.as_dict().items() if n]
    verdict = approve(args, "flush", f"every key of {queue.keys.spider}", held or ["(no keys)"])
    if not verdict:
        return 0 if verdict is None else 1
    await queue.flush()
    print(f"flushed {queue.keys.spider}")
    return 0
