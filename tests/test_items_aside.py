"""An entry a sink can never write costs that entry alone: it is set aside (copied with its
reason to ``ha:{S}:items_aside`` and acknowledged, in one fenced call) once it failed alone 3
times, and every other entry is written once; an error that says "not now" (``RetryLater``,
a lost connection, a database that is down) sets nothing aside. Before, one such entry
stalled its sink for ever: every later item waited."""

from __future__ import annotations

import asyncio
import collections
import json
from typing import Any

import pytest
import redis
import redis.asyncio
import scrapy
import sqlalchemy
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.demo.harness import free_port
from scrapy_ha.items import (
    Entry,
    ItemConsumer,
    JsonLinesSink,
    PipelinesSink,
    RetryLater,
    SqlSink,
    consume,
    current_entry,
)
from scrapy_ha.keys import Keys
from scrapy_ha.store.items import Aside, ItemStream
from scrapy_ha.store.sharding import make_queue
from tests.cli_seed import scrapy_ha
from tests.test_items_aside_kills import refuse_bad_items
from tests.test_metrics import Exporter, value

KEYS = Keys("ha", "s")


async def fill(url: str, n: int, bad: set[int]) -> None:
    client = redis.asyncio.Redis.from_url(url)
    items = [json.dumps({"id": i, **({"bad": 1} if i in bad else {})}) for i in range(1, n + 1)]
    await ItemStream(client, KEYS).add([i.encode() for i in items])
    await client.aclose()


def aside(url: str) -> list[dict[bytes, bytes]]:
    client = redis.Redis.from_url(url)
    entries = [fields for _, fields in client.xrange(KEYS.items_aside)]
    client.close()
    return entries


class Refusing(JsonLinesSink):
    """A JSON Lines file that refuses an item with "bad" (its own error, every time)."""

    def _write(self, entries: list[Entry]) -> None:
        if any(json.loads(e.data).get("bad") for e in entries):
            raise ValueError("an item this sink refuses: token=hunter2")
        super()._write(entries)


@deferred_f_from_coro_f
async def test_bad_entries_in_a_row_and_among_good_ones_are_set_aside_and_the_rest_written_once(
    redis_url, tmp_path
):
    bad = {1, 2, 3, 9, 20, 21, 22, 23, 30}  # the first three, a run of four, the last one
    await fill(redis_url, 30, bad)
    path = tmp_path / "items.jl"
    job = consume(
        redis_url, "s", Refusing(path), group="jl", batch=30, alone_pause=0, exit_idle=0.2
    )
    report = await asyncio.wait_for(job, 60)
    good = [i for i in range(1, 31) if i not in bad]
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == good
    parked = aside(redis_url)
    assert [json.loads(f[b"i"])["id"] for f in parked] == sorted(bad)
    first = parked[0]
    assert first[b"g"] == b"jl" and first[b"s"] == f"jsonl:{path}".encode()
    assert first[b"n"] == b"3" and first[b"r"].startswith(b"ValueError: an item this sink")
    assert b"hunter2" not in first[b"r"]  # masked
    assert (report.set_aside, report.consumed) == (9, 21)
    client = redis.Redis.from_url(redis_url)
    assert client.xlen(KEYS.items) == 0
    assert client.hget(KEYS.stats, "items_aside:jl") == b"9"
    client.close()
    shown = scrapy_ha("status", "s", "--redis-url", redis_url)
    assert "sink  jl: backlog 0, consumed 21, set aside 9, 1 consumer(s)" in shown.stdout
    exporter = Exporter(redis_url)
    try:
        assert value(exporter.scrape(), "scrapy_ha_items_aside_total", spider="s", group="jl") == 9
    finally:
        exporter.stop()


class Flaky:
    """A pipeline that says "not now" (RetryLater, a 429) to each of its first 25 calls and
    to every third after, loses its connection now and then, fails each item's first try
    with an error of its own (a timing it depends on), and refuses item 7 every time. It
    stores what it accepts by current_entry(): exactly once."""

    stored: collections.Counter[str] = collections.Counter()
    tried: collections.Counter[str] = collections.Counter()
    calls = 0

    def process_item(self, item: Any) -> Any:
        Flaky.calls += 1
        entry = current_entry() or ""
        Flaky.tried[entry] += 1
        if Flaky.calls <= 25 or Flaky.calls % 3 == 0:
            raise RetryLater("429 Too Many Requests")
        if Flaky.calls % 7 == 0:
            raise ConnectionResetError("connection reset by peer")
        if item["id"] == 7:
            raise ValueError("item 7 is refused")
        if Flaky.tried[entry] == 1:
            raise RuntimeError("a timing-dependent failure")
        Flaky.stored[entry] += 1
        return item


@deferred_f_from_coro_f
async def test_an_error_that_says_not_now_sets_nothing_aside(redis_url):
    await fill(redis_url, 40, set())
    crawler = get_crawler(settings_dict={"ITEM_PIPELINES": {f"{__name__}.Flaky": 100}})
    sink = PipelinesSink(crawler, scrapy.Spider("s"))
    job = consume(
        redis_url, "s", sink, group="p", batch=10, alone_pause=0, retry_pause=0, exit_idle=0.2
    )
    report = await asyncio.wait_for(job, 120)
    assert report.set_aside == 1 and [json.loads(f[b"i"])["id"] for f in aside(redis_url)] == [7]
    assert len(Flaky.stored) == 39 and set(Flaky.stored.values()) == {1}


class DownThenUp(SqlSink):
    """A database that is down (connection refused) for its first four writes, then up."""

    def __init__(self, down: str, up: str) -> None:
        super().__init__(up, "s")
        self.up, self.engine, self.failed = self.engine, sqlalchemy.create_engine(down), 0

    def _write(self, entries: list[Entry]) -> None:
        try:
            super()._write(entries)
        except Exception:
            self.failed += 1
            if self.failed == 4:
                self.engine = self.up
            raise

    async def open(self) -> list[str]:
        return []


@deferred_f_from_coro_f
async def test_a_database_that_is_down_sets_nothing_aside_and_bad_rows_do_not_stall_it(
    redis_url, archive_url
):
    await fill(redis_url, 20, {5, 6, 7})
    refuse_bad_items(archive_url)
    down = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/none"
    sink = DownThenUp(down, archive_url)
    job = consume(
        redis_url, "s", sink, group="sql", batch=20, alone_pause=0, retry_pause=0, exit_idle=0.2
    )
    report = await asyncio.wait_for(job, 120)
    assert sink.failed >= 4 and report.set_aside == 3
    rows = await asyncio.to_thread(sink.rows)
    await sink.close()
    assert sorted(r["item"]["id"] for r in rows) == [i for i in range(1, 21) if i not in {5, 6, 7}]
    assert sorted(json.loads(f[b"i"])["id"] for f in aside(redis_url)) == [5, 6, 7]


@deferred_f_from_coro_f
async def test_only_the_consumer_an_entry_is_pending_to_sets_it_aside(redis_url):
    """A consumer whose entry another one took over (XAUTOCLAIM after idle) sets nothing
    aside; an entry acknowledged already neither; the set-aside and the ack are one call."""
    await fill(redis_url, 3, set())
    client = redis.asyncio.Redis.from_url(redis_url)
    stream = ItemStream(client, KEYS)
    await stream.join("g")
    (first, second, third) = await stream.read("g", "a", 3)
    await stream.claim("g", "b", 0, 1)  # b takes the oldest over
    why = Aside("jsonl:/x", "ValueError: no", 3)
    assert await stream.set_aside("g", "a", first.id, why) == -1
    assert await stream.set_aside("g", "b", first.id, why) == 1
    assert await stream.set_aside("g", "b", first.id, why) == 0  # not pending any more
    await stream.ack("g", [second.id])
    assert await stream.set_aside("g", "a", second.id, why) == 0
    assert await client.xlen(KEYS.items_aside) == 1
    await client.set(KEYS.items_aside, "not a stream")
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE items_aside"):
        await stream.set_aside("g", "a", third.id, why)
    assert (await client.xpending(KEYS.items, "g"))["pending"] == 1  # still pending to a
    await client.aclose()


@deferred_f_from_coro_f
async def test_an_entry_that_fails_alone_fewer_times_than_the_limit_is_written(redis_url, tmp_path):
    """A failure that passes (twice, then it writes) sets nothing aside."""

    class TwiceBad(JsonLinesSink):
        alone = 0

        def _write(self, entries: list[Entry]) -> None:
            if any(json.loads(e.data).get("bad") for e in entries):
                if len(entries) > 1 or TwiceBad.alone < 2:
                    TwiceBad.alone += len(entries) == 1
                    raise ValueError("not yet")
            super()._write(entries)

    await fill(redis_url, 10, {4})
    path = tmp_path / "items.jl"
    client = redis.asyncio.Redis.from_url(redis_url)
    queue = make_queue(client, "ha", "s", 1)
    runner = ItemConsumer(queue, TwiceBad(path), group="jl", batch=10, alone_pause=0)
    report = await asyncio.wait_for(runner.run(exit_idle=0.2), 60)
    await client.aclose()
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == list(range(1, 11))
    assert report.set_aside == 0 and aside(redis_url) == []


@deferred_f_from_coro_f
async def test_items_set_aside_are_listed_and_put_back_for_their_sink_alone(redis_url, tmp_path):
    """`scrapy-ha aside list` shows them; `aside put-back` adds them to the stream again for
    the group that set them aside: that sink, fixed, writes them; the others skip them."""
    await fill(redis_url, 12, {4, 9})
    bad_path, ok_path = tmp_path / "bad.jl", tmp_path / "ok.jl"
    client = redis.asyncio.Redis.from_url(redis_url)
    for group in ("jl", "ok"):  # both sinks declared before either consumes
        await ItemStream(client, KEYS).join(group)
    await client.aclose()
    for sink, group in ((Refusing(bad_path), "jl"), (JsonLinesSink(ok_path), "ok")):
        await asyncio.wait_for(
            consume(redis_url, "s", sink, group=group, alone_pause=0, exit_idle=0.2), 60
        )
    shown = scrapy_ha("aside", "list", "s", "--redis-url", redis_url)
    assert shown.returncode == 0, shown.stderr
    assert "group jl" in shown.stdout and "2 item(s) set aside" in shown.stdout
    back = scrapy_ha("aside", "put-back", "s", "--all", "--yes", "--redis-url", redis_url)
    assert back.returncode == 0 and "put back 2 item(s)" in back.stdout, back.stderr
    assert aside(redis_url) == []
    for sink, group in ((JsonLinesSink(bad_path), "jl"), (JsonLinesSink(ok_path), "ok")):
        report = await asyncio.wait_for(
            consume(redis_url, "s", sink, group=group, exit_idle=0.2), 60
        )
        assert report.consumed == 2  # acknowledged by both, written by jl alone
    ids = [json.loads(line)["id"] for line in bad_path.read_text().splitlines()]
    assert ids == [1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 4, 9]
    assert [json.loads(line)["id"] for line in ok_path.read_text().splitlines()] == list(
        range(1, 13)
    )
