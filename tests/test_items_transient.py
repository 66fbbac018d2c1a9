"""A transient error may be one item's (a CHECK that overflows, an API that drops the
connection on it): a batch that keeps failing transiently is written in halves, one level
per round, so every other item of it reaches the sink within a bounded number of rounds,
while other entries commit or not; the lone entry stays pending, never set aside."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio
import sqlalchemy
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.items import SqlSink
from tests.test_items_aside import POISON, Store, aside, fill, pipelines_sink, run, stored

#: Seconds a consumer may take to store the good items of a batch failing transiently.
LIMIT = 60.0


class Overflowing(SqlSink):
    """A table whose CHECK overflows on the poison item: sqlite's OperationalError
    'integer overflow', transient by its class. The batch sizes it was handed, per write."""

    sizes: list[int]

    def _write(self, entries: list[Any]) -> int:
        self.sizes.append(len(entries))
        return super()._write(entries)


def overflowing_table(url: str) -> None:
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as conn:
        conn.execute(
            sqlalchemy.text(
                "CREATE TABLE scrapy_ha_items (spider VARCHAR(200) NOT NULL, entry_id "
                "VARCHAR(64) NOT NULL, item JSON NOT NULL, committed_at TIMESTAMP NOT NULL, "
                "PRIMARY KEY (spider, entry_id), CHECK (CASE WHEN json_extract(item, '$.id') "
                f"= {POISON} THEN abs(-9223372036854775807 - 1) ELSE 1 END))"
            )
        )
    engine.dispose()


@deferred_f_from_coro_f
async def test_a_table_failing_one_item_transiently_stores_the_others_in_bounded_rounds(
    redis_url, tmp_path
):
    url = f"sqlite:///{tmp_path / 'items.db'}"
    overflowing_table(url)
    sink = Overflowing(url, "s")
    sink.sizes = []
    client = redis.asyncio.Redis.from_url(redis_url)
    await fill(client, list(range(1, 11)))

    async def work() -> None:
        async with asyncio.timeout(LIMIT):  # never, before: the batch failed whole for ever
            while len(stored(sink)) < 9:
                await asyncio.sleep(0.1)

    report = await run(redis_url, sink, "sql", work)
    assert stored(sink) == sorted(set(range(1, 11)) - {POISON})
    # 3 rounds of the whole batch, then per round at most 2 writes per level (10, 5, 3, 2, 1)
    # and each level in at most 2 rounds
    assert sink.sizes[:3] == [10, 10, 10] and len(sink.sizes) <= 3 + 4 * 2 * 2, sink.sizes
    assert report.set_aside == 0 and aside(redis_url) == []
    await client.aclose()


@deferred_f_from_coro_f
async def test_a_pipeline_failing_one_item_transiently_in_a_live_crawl_lets_the_rest_through(
    redis_url,
):
    """Fresh items commit in every round: they prove the sink works, and do not restart the
    count of rounds in which the first batch failed transiently."""
    sink = pipelines_sink()
    Store.refuse = staticmethod(
        lambda item: ConnectionResetError("peer reset") if item["id"] == POISON else None
    )
    client = redis.asyncio.Redis.from_url(redis_url)
    await fill(client, list(range(1, 11)))

    def first_batch() -> list[int]:
        return sorted(i for i in (item["id"] for item in Store.items.values()) if i <= 10)

    async def work() -> None:
        async with asyncio.timeout(LIMIT):  # never, before: each fresh commit reset the count
            for n in range(100, 10_000):  # a live crawl: an item every 0.1 s
                if len(first_batch()) == 9:
                    return
                await fill(client, [n])
                await asyncio.sleep(0.1)

    report = await run(redis_url, sink, "p", work)
    assert first_batch() == sorted(set(range(1, 11)) - {POISON})
    assert report.set_aside == 0 and aside(redis_url) == []
    await client.aclose()
