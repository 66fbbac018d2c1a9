"""A sink's consumer in a process of its own that SIGKILLs itself at one point of the
bisection of a failed batch, for tests/test_items_aside_kills.py.

The sink is a real JSON Lines file or SQL table; for JSON Lines, an item with ``"bad"``
makes the write fail (``ValueError``: the entry's own error), as a column refuses it in SQL
(the test's table has a constraint). KILL is ``<point>:<n>``: the process kills itself the
*n*-th time it reaches *point* (``-`` never: it runs until the crawl's items are all in):

- ``written``: a JSON Lines batch appended and made durable, its offset not recorded
- ``recorded``: a batch committed (offset recorded, or SQL transaction committed), not
  acknowledged
- ``acked``: a batch acknowledged, before anything else
- ``aside``: before the call that sets an entry aside; ``asided``: after it

Usage: python -m tests.aside_sink REDIS_URL SINK KILL
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import sys
from typing import Any

from scrapy_ha.items import JsonLinesSink, SqlSink, consume
from scrapy_ha.store.items import ItemStream

REACHED: collections.Counter[str] = collections.Counter()
POINT, _, NTH = sys.argv[3].partition(":")


def reach(point: str) -> None:
    REACHED[point] += 1
    if point == POINT and REACHED[point] == int(NTH):
        os.kill(os.getpid(), signal.SIGKILL)


class Jsonl(JsonLinesSink):
    def _write(self, entries: list[Any]) -> None:
        if any(json.loads(e.data).get("bad") for e in entries):
            raise ValueError("an item this sink refuses")
        super()._write(entries)

    def _record(self, ids: list[str], length: int | None = None) -> None:
        if ids:
            reach("written")
        super()._record(ids, length)
        if ids:
            reach("recorded")


class Sql(SqlSink):
    def _write(self, entries: list[Any]) -> None:
        super()._write(entries)
        reach("recorded")


def patch() -> None:
    ack, set_aside = ItemStream.ack, ItemStream.set_aside

    async def acked(self: ItemStream, group: str, ids: list[str]) -> tuple[int, int]:
        done = await ack(self, group, ids)
        if ids:
            reach("acked")
        return done

    async def aside(self: ItemStream, *args: Any) -> int:
        reach("aside")
        done = await set_aside(self, *args)
        reach("asided")
        return done

    ItemStream.ack = acked  # type: ignore[method-assign]
    ItemStream.set_aside = aside  # type: ignore[method-assign]


async def main() -> None:
    url, to = sys.argv[1], sys.argv[2]
    sink: Any = Jsonl(to[len("jsonl:") :]) if to.startswith("jsonl:") else Sql(to, "s")
    patch()
    report = await consume(
        url, "s", sink, group="g", consumer="c", batch=40, alone_pause=0, exit_idle=0.3
    )
    print(json.dumps(report.__dict__))


if __name__ == "__main__":
    asyncio.run(main())
