"""``scrapy-ha flush SPIDER``: delete every key of a crawl but its checkpoints (refused while
workers live); ``scrapy-ha checkpoints reset SPIDER --all`` deletes those."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from scrapy_ha.cli.common import approve
from scrapy_ha.store.state import CheckpointStore

if TYPE_CHECKING:
    import argparse

    from scrapy_ha.store.queue import RedisQueue


#: What ``flush`` says when the crawl has checkpoints: a new crawl resumes from them.
KEPT = (
    "; its checkpoints are kept (a new crawl resumes its tasks from them): "
    "`scrapy-ha checkpoints reset {spider} --all` deletes them"
)


async def flush(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Delete every key of the crawl but its checkpoints (dead-letter queue included), and
    say so when it has some; refuses while workers live."""
    counts = await queue.counts()
    if counts.workers and not args.force:
        print(
            f"{counts.workers} worker(s) of {queue.keys.spider} are alive: stop them first, "
            f"or pass --force",
            file=sys.stderr,
        )
        return 1
    spider = queue.keys.spider
    held = [f"{name}: {n}" for name, n in counts.as_dict().items() if n]
    what = f"every key of {spider} but its checkpoints"
    verdict = approve(args, "flush", what, held or ["(no keys)"])
    if not verdict:
        return 0 if verdict is None else 1
    await queue.flush()
    kept = await CheckpointStore(queue.client, queue.keys).exists()
    print(f"flushed {spider}" + (KEPT.format(spider=spider) if kept else ""))
    return 0
