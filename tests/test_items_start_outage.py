"""An item consumer that loses Redis while it starts waits for it, as its loop does.

A sharded crawl on a Redis Cluster, a master killed a few seconds into ``scrapy-ha items``:
the consumer exited ("went away during the command") where one already in its loop rode
the failover out, and its sink got nothing until someone started it again. Here a real
redis-server with an append-only file is killed as the sink opens and started again on
its port a moment later.
"""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING, Any

import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.sinks.consumer import ItemConsumer
from scrapy_ha.sinks.jsonl import JsonLinesSink
from scrapy_ha.store.queue import RedisQueue
from tests import redis_servers
from tests.test_items_sink_kills import KEYS, fill

if TYPE_CHECKING:
    from pathlib import Path

#: Items in the stream (a few batches).
ITEMS = 120
#: Seconds Redis stays away.
AWAY = 1.0


class OutageSink(JsonLinesSink):
    """A file sink whose opening kills the crawl's Redis, started again after :data:`AWAY`."""

    def __init__(self, path: Path, server: redis_servers.Server) -> None:
        super().__init__(path)
        self.server = server
        self.again: list[redis_servers.Server] = []

    async def open(self) -> list[str]:
        recovered = await super().open()
        self.server.kill()

        def restart() -> None:
            time.sleep(AWAY)
            self.again.append(redis_servers.start(self.server.dir, *PERSIST, port=self.server.port))

        threading.Thread(target=restart, daemon=True).start()
        return recovered


PERSIST = ("--appendonly", "yes", "--appendfsync", "always")


@deferred_f_from_coro_f
async def test_a_consumer_that_loses_redis_as_it_starts_waits_for_it(tmp_path: Path) -> None:
    server = redis_servers.start(tmp_path / "redis", *PERSIST)
    url = f"redis://127.0.0.1:{server.port}/0"
    fill(url, ITEMS)
    client = redis.asyncio.Redis.from_url(url)
    path = tmp_path / "items.jsonl"
    sink = OutageSink(path, server)
    try:
        runner = ItemConsumer(RedisQueue(client, KEYS), sink, group="g", batch=40)
        report: Any = await runner.run(exit_idle=0.2)
    finally:
        await client.aclose()
        for started in [server, *sink.again]:
            started.kill()
    ids = [json.loads(line)["id"] for line in path.read_text().splitlines()]
    assert sorted(ids) == list(range(1, ITEMS + 1))  # each once
    assert report.consumed == ITEMS
