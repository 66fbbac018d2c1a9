"""A consumer process for tests/test_items_aside_kills.py: ``python -m tests.aside_consumer
REDIS_URL DB_URL KILLER``: consumes the crawl ``s`` into an SQL table, and exits at once
(``os._exit``: no cleanup, as a segfault or the OOM killer) whenever a write holds the item
whose ``id`` is KILLER (0: none). Exits 0 once the crawl's items are all in."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from scrapy_ha.items import SqlSink, consume


class Killer(SqlSink):
    killer = 0

    def _write(self, entries: list[Any]) -> int:
        if any(e.plain().get("id") == self.killer for e in entries):
            os._exit(3)
        return super()._write(entries)


def main() -> None:
    redis_url, db_url, killer = sys.argv[1:4]
    sink = Killer(db_url, "s")
    sink.killer = int(killer)
    asyncio.run(
        consume(redis_url, "s", sink, group="sql", consumer="c", batch=40, exit_idle=0.3, deaths=3)
    )


if __name__ == "__main__":
    main()
