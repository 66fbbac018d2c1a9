"""``scrapy-ha items SPIDER --to SINK --undeclare``: take a sink's consumer group away.

An entry leaves the item stream once every group has acknowledged it, so a group declared by
mistake (a mistyped path, a sink given up) keeps every later item in Redis for ever. This
destroys the group in every shard's stream (what it had not consumed is lost to that sink,
not to the others) and trims the entries every other group has acknowledged. A consumer of
the group that read within ``--claim-idle`` seconds is taken to be running: the command
refuses until it is stopped (a running consumer would find its group gone).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import redis

from scrapy_ha.cli.common import approve, plural
from scrapy_ha.store.items import ItemStream
from scrapy_ha.store.sharding import shards_of
from scrapy_ha.store.wire import text

if TYPE_CHECKING:
    import argparse

    from scrapy_ha.store.queue import RedisQueue

__all__ = ["undeclare"]


async def undeclare(queue: RedisQueue, group: str, args: argparse.Namespace) -> int:
    """Destroy *group* in the crawl's item streams, once confirmed (--yes, --dry-run)."""
    spider = queue.keys.spider
    streams = [ItemStream(q.client, q.keys) for q in shards_of(queue)]
    backlog, running, found = 0, set(), False
    for stream in streams:
        state = await stream.state()
        mine = [g for g in state.groups if g.name == group]
        if not mine:
            continue
        found = True
        backlog += mine[0].backlog
        for c in await stream.client.xinfo_consumers(stream.key, group):
            if c["idle"] < args.claim_idle * 1000:
                running.add(text(c["name"]))
    if not found:
        print(f"no group {group} in the item stream of {spider}: nothing changed", file=sys.stderr)
        return 1
    if running:
        names = ", ".join(sorted(running))
        print(
            f"group {group} of {spider} has consumers that read less than {args.claim_idle:g} "
            f"s ago ({names}): stop them first (--claim-idle sets how long ago counts)",
            file=sys.stderr,
        )
        return 1
    lost = f"{plural(backlog, 'item')} it has not consumed, lost to its sink"
    verdict = approve(args, "undeclare", f"group {group} of {spider}", [f"{group}: {lost}"])
    if not verdict:
        return 0 if verdict is None else 1
    trimmed = 0
    for stream in streams:
        try:
            await stream.client.xgroup_destroy(stream.key, group)
        except redis.ResponseError:  # no stream in this shard
            continue
        trimmed += (await stream.ack(group, []))[1]  # what every other group has
    print(
        f"undeclared group {group} of {spider} ({lost}); {plural(trimmed, 'entry', 'entries')} "
        "every other group had left the stream"
    )
    return 0
