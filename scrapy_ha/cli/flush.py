"""``scrapy-ha flush SPIDER``: delete every key of a crawl but its checkpoints (refused while
workers live); ``scrapy-ha checkpoints reset SPIDER --all`` deletes those."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from scrapy_ha.cli.common import approve
from scrapy_ha.store.items import crawl_items
from scrapy_ha.store.state import CheckpointStore

if TYPE_CHECKING:
    import argparse

    from scrapy_ha.store.queue import RedisQueue


#: What ``flush`` says when the crawl has checkpoints: a new crawl resumes from them. A
#: sharded crawl's count goes with the flush, so the commands that read its checkpoints
#: need ``--shards`` (a QA run: the reset named without it answered "no such crawl").
KEPT = (
    "; its checkpoints are kept (a new crawl resumes its tasks from them): "
    "`scrapy-ha checkpoints reset {spider} --all{shards}` deletes them"
)
SHARDED = (
    " (its shard count went with the flush: give `--shards {n}` to `checkpoints list` and "
    "`reset` until a worker starts the crawl again)"
)

#: What a forced ``flush`` says of the workers alive (a QA run: 2 workers mid-crawl logged
#: refused acks as "leases expired", then "Run 2 of the crawl finished", 112 pending gone).
LIVE = (
    "note: {n} live worker(s) now find the crawl empty: what they hold is refused (their "
    "logs say expired leases), then each closes as if the crawl had finished (finish "
    "reason finished), or waits for start URLs in feed mode (HA_FEED)"
)


async def flush(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Delete every key of the crawl but its checkpoints (dead-letter queue included), and
    say so when it has some; refuses while workers live."""
    counts = await queue.counts()
    if counts.workers and not args.force:
        print(
            f"{counts.workers} worker(s) of {queue.keys.spider} are alive: stop them first "
            f"(`scrapy-ha stop {queue.keys.spider}`), or pass --force",
            file=sys.stderr,
        )
        return 1
    spider = queue.keys.spider
    held = [f"{name}: {n}" for name, n in counts.as_dict().items() if n]
    # the item stream goes too (a QA run: "(no keys)" listed while 70 items a declared sink
    # had not consumed were in it, lost to the sink by the flush)
    items = await crawl_items(queue)
    lost = []  # (named after the flush too: with --yes, nothing else says it)
    if items.length:
        lost.append(f"items not consumed by every sink yet (lost to them): {items.length}")
    if items.aside:
        lost.append(f"items set aside by a sink (`items --aside`): {items.aside}")
    held += lost
    what = f"every key of {spider} but its checkpoints"
    verdict = approve(args, "flush", what, held or ["(no keys)"])
    if not verdict:
        return 0 if verdict is None else 1
    shards = queue.keys.shards
    await queue.flush()
    kept = await CheckpointStore(queue.client, queue.keys).exists()  # (every shard's)
    said = f" --shards {shards}" if shards > 1 else ""
    note = SHARDED.format(n=shards) if shards > 1 else ""
    # the items no sink will get are named whether or not a prompt was shown (a QA run:
    # `flush --yes` deleted 4,000 of them, silently)
    gone = f" ({'; '.join(lost)})" if lost else ""
    print(
        f"flushed {spider}{gone}" + (KEPT.format(spider=spider, shards=said) + note if kept else "")
    )
    if counts.workers:  # (before: unsaid; their logs blame expired leases, then "finished")
        print(LIVE.format(n=counts.workers), file=sys.stderr)
    return 0
