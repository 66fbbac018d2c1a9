"""``scrapy-ha aside list|put-back SPIDER``: the items a sink could not write, set aside
(``ha:{S}:items_aside``, see :mod:`scrapy_ha.sinks.aside`), and putting them back into the
item stream once the sink (or the item) is fixed: each goes back for the sink that set it
aside alone (the other sinks wrote it already)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy_ha.cli.options import at, bulk_options, command, group

if TYPE_CHECKING:
    import argparse

    from scrapy_ha.store.queue import RedisQueue

__all__ = ["aside_commands", "aside_list", "aside_put_back"]

#: Characters of an item shown by ``aside list``.
ITEM_SHOWN = 120


def aside_commands(sub: Any) -> None:
    """The grammar: ``aside list SPIDER`` and ``aside put-back SPIDER [ID...|--all]``."""
    aside = group(sub, "aside", "the items a sink could not write, set aside")
    command(aside, "list", at("aside", "aside_list"), "id, group, failures, reason, item")
    back = command(
        aside,
        "put-back",
        at("aside", "aside_put_back"),
        "add items set aside to the item stream again, for their sink alone",
    )
    back.add_argument("ids", nargs="*", metavar="ID", help="ids (see `aside list`)")
    back.add_argument("--all", action="store_true", help="every item set aside")
    bulk_options(back)


async def _entries(queue: RedisQueue) -> list[tuple[str, dict[str, str]]]:
    """Every entry set aside, its id prefixed by its shard (``<shard>:``) from shard 1 on."""
    from scrapy_ha.store.items import ItemStream  # the grammar imports this module: no redis
    from scrapy_ha.store.sharding import shards_of

    out = []
    for shard, q in enumerate(shards_of(queue)):
        for entry_id, fields in await ItemStream(q.client, q.keys).set_aside_entries(10**6):
            out.append((f"{shard}:{entry_id}" if shard else entry_id, fields))
    return out


async def aside_list(queue: RedisQueue, args: argparse.Namespace) -> int:
    """List the items set aside, oldest first."""
    entries = await _entries(queue)
    for entry_id, f in entries:
        print(
            f"{entry_id}  group {f.get('g')}  sink {f.get('s')}  failed alone {f.get('n')}x  "
            f"entry {f.get('e')}  {f.get('r')}\n    {f.get('i', '')[:ITEM_SHOWN]}"
        )
    print(f"{len(entries)} item(s) set aside in {queue.keys.items_aside}")
    return 0


async def aside_put_back(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Put items set aside back into the stream, each for its group alone."""
    from scrapy_ha.cli.common import approve
    from scrapy_ha.store.items import ItemStream
    from scrapy_ha.store.sharding import shards_of

    known = [entry_id for entry_id, _ in await _entries(queue)]
    ids = known if args.all else [i for i in args.ids if i in known]
    if missing := [i for i in ([] if args.all else args.ids) if i not in known]:
        print(f"not set aside: {' '.join(missing)}")
    verdict = approve(args, "put back", f"{len(ids)} item(s) set aside", ids)
    if not verdict:
        return 0 if verdict is None else 1
    shards, done = shards_of(queue), 0
    by: dict[int, list[str]] = {}
    for entry_id in ids:
        head, sep, tail = entry_id.partition(":")
        by.setdefault(int(head) if sep else 0, []).append(tail if sep else entry_id)
    for shard, local in by.items():
        done += await ItemStream(shards[shard].client, shards[shard].keys).put_back(local)
    print(f"put back {done} item(s) into {queue.keys.items}")
    return 0 if done == len(ids) else 1
