"""An entry a sink cannot write costs that entry alone: it is set aside (``items_aside``, with
its reason, acknowledged in the group) once it failed on its own twice with the sink
committing other entries in between, and the others go on; a sink that fails everything (a
database that is down) sets nothing aside and gets every entry once it is back."""

from __future__ import annotations

import asyncio
import collections
import json
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio
import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.codec.items import encode_item, plain_item
from scrapy_ha.items import JsonLinesSink, PipelinesSink, SqlSink, consume
from scrapy_ha.keys import Keys
from scrapy_ha.store.items import ItemStream

if TYPE_CHECKING:
    from scrapy_ha.items import Entry

KEYS = Keys("ha", "s")
#: A JSON API's emoji cut in half: an unpaired surrogate, which no UTF-8 file can hold.
SURROGATE = {"id": 3, "title": "caf\ud83d"}


async def fill(url: str, items: list[Any]) -> None:
    client = redis.asyncio.Redis.from_url(url)
    await ItemStream(client, KEYS).add([encode_item(i, None) for i in items])
    await client.aclose()


async def run(url: str, sink: Any, **options: Any) -> Any:
    """Consume until the crawl's items are in the sink (30 s at most: a stalled sink fails)."""
    job = consume(url, "s", sink, group="g", batch=10, exit_idle=0.3, **options)
    return await asyncio.wait_for(job, 30)


def set_aside(url: str) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(url)
    try:
        rows = client.xrange(KEYS.items_aside)
        (group,) = client.xinfo_groups(KEYS.items)
        assert (group["pending"], group["lag"]) == (0, 0)  # nothing left behind
        assert int(client.hget(KEYS.stats, "items_aside:g") or 0) == len(rows)
        return [{k.decode(): v for k, v in fields.items()} for _, fields in rows]
    finally:
        client.close()


@deferred_f_from_coro_f
async def test_a_json_lines_entry_the_file_cannot_hold_is_set_aside(redis_url, tmp_path):
    await fill(redis_url, [{"id": 1}, {"id": 2}, SURROGATE, *({"id": i} for i in range(4, 31))])
    path = tmp_path / "items.jl"
    report = await run(redis_url, JsonLinesSink(path))
    ids = [json.loads(line)["id"] for line in path.read_text().splitlines()]
    assert ids == [i for i in range(1, 31) if i != 3]
    assert (report.consumed, report.set_aside) == (29, 1)
    (row,) = set_aside(redis_url)
    assert row["g"] == b"g" and b"UnicodeEncodeError" in row["r"]
    assert plain_item(row["i"])["id"] == 3  # the item is kept, to be fixed and replayed


@deferred_f_from_coro_f
async def test_an_sql_entry_postgresql_refuses_is_set_aside(redis_url, postgres_url):
    """PostgreSQL's json type has no NaN: one price that is not a number."""
    await fill(
        redis_url, [{"id": i, "price": float("nan") if i == 12 else 1.0} for i in range(1, 31)]
    )
    sink = SqlSink(postgres_url, "s")
    report = await run(redis_url, sink)
    rows = await asyncio.to_thread(sink.rows)
    await sink.close()
    assert sorted(r["item"]["id"] for r in rows) == [i for i in range(1, 31) if i != 12]
    assert (report.consumed, report.set_aside) == (29, 1)
    (row,) = set_aside(redis_url)
    assert b"NaN" in row["r"] and plain_item(row["i"])["id"] == 12


SEEN: collections.Counter[int] = collections.Counter()


class Constraint:
    def process_item(self, item: Any) -> Any:
        SEEN[item["id"]] += 1
        if item["id"] == 3:
            raise ValueError("constraint violated by this one item")
        return item


class S(scrapy.Spider):
    name = "s"


@deferred_f_from_coro_f
async def test_a_pipeline_that_fails_one_item_gets_the_others_once(redis_url):
    SEEN.clear()
    await fill(redis_url, [{"id": i} for i in range(1, 31)])
    crawler = get_crawler(S, {"ITEM_PIPELINES": {f"{__name__}.Constraint": 1}})
    report = await run(redis_url, PipelinesSink(crawler, S()), consumer="c")
    assert SEEN == {**dict.fromkeys(range(1, 31), 1), 3: 2}  # the bad one: twice, on its own
    assert (report.consumed, report.set_aside) == (29, 1)
    (row,) = set_aside(redis_url)
    assert row["r"] == b"ValueError: constraint violated by this one item"


class Down:
    """A sink of one's own whose database is down for its first *failures* writes, then
    back; or that refuses item *bad* for good."""

    shares = True

    def __init__(self, failures: int = 0, bad: int | None = None) -> None:
        self.failures, self.bad = failures, bad
        self.items: list[int] = []

    async def open(self) -> list[str]:
        return []

    async def write(self, entries: list[Entry]) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionRefusedError("database is down")
        ids = [e.plain()["id"] for e in entries]
        if self.bad in ids:
            raise ValueError(f"item {self.bad} is refused")
        self.items += ids

    async def close(self) -> None:
        pass


@deferred_f_from_coro_f
async def test_a_sink_that_is_down_sets_nothing_aside_and_gets_every_item_back(redis_url):
    await fill(redis_url, [{"id": i} for i in range(1, 31)])
    sink = Down(failures=12)  # several batches, each entry of them, fail
    report = await run(redis_url, sink)
    assert sorted(sink.items) == list(range(1, 31))
    assert report.set_aside == 0 and report.errors >= 2
    assert set_aside(redis_url) == []


@deferred_f_from_coro_f
async def test_a_failing_entry_with_nothing_else_committed_since_waits_for_proof(redis_url):
    """The last entry of a batch fails after the others committed: no commit came between
    two of its failures yet, so it waits; once the sink commits new entries it is set
    aside."""
    await fill(redis_url, [{"id": i} for i in range(1, 11)])
    sink = Down(bad=10)
    stop = asyncio.Event()
    job = asyncio.ensure_future(consume(redis_url, "s", sink, group="g", batch=10, stop=stop))
    await asyncio.sleep(2)
    assert sink.items == list(range(1, 10))
    assert _pending(redis_url) == 1  # not set aside: no proof yet
    await fill(redis_url, [{"id": i} for i in range(11, 21)])
    for _ in range(100):
        if _pending(redis_url) == 0 and len(sink.items) == 19:
            break
        await asyncio.sleep(0.1)
    stop.set()
    report = await asyncio.wait_for(job, 30)
    assert sorted(sink.items) == [i for i in range(1, 21) if i != 10]
    assert report.set_aside == 1 and len(set_aside(redis_url)) == 1


def _pending(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return int(client.xinfo_groups(KEYS.items)[0]["pending"])
    finally:
        client.close()
