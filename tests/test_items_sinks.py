"""The sinks of the item stream: each item once in a JSON Lines file and in an SQL table
(SQLite and PostgreSQL), whatever point their consumer is stopped at; consumer groups share
the work within a sink and each sink gets every item; consumed entries leave the stream."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import pytest
import redis
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.config.validate import ConfigError
from scrapy_ha.items import Entry, JsonLinesSink, SqlSink, consume
from scrapy_ha.keys import Keys
from scrapy_ha.store.items import ItemStream
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry

if TYPE_CHECKING:
    from pathlib import Path

KEYS = Keys("ha", "s")


async def fill(redis_url: str, ids: range) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    items = [json.dumps({"id": i, "when": {"__da": "2026-12-01"}}).encode() for i in ids]
    await ItemStream(client, KEYS).add(items)
    await client.aclose()


def lines(path: Path) -> list[int]:
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


@deferred_f_from_coro_f
async def test_a_json_lines_file_gets_every_item_once_and_the_stream_is_trimmed(
    redis_url, tmp_path
):
    await fill(redis_url, range(1, 251))
    sink = JsonLinesSink(tmp_path / "items.jl")
    report = await consume(redis_url, "s", sink, group="jl", batch=100, exit_idle=0.2)
    assert lines(tmp_path / "items.jl") == list(range(1, 251))
    assert json.loads((tmp_path / "items.jl").read_text().splitlines()[0])["when"] == "2026-12-01"
    assert (report.consumed, report.batches) == (250, 3)
    client = redis.Redis.from_url(redis_url)
    assert client.xlen(KEYS.items) == 0  # the one group acknowledged every entry
    assert client.hget(KEYS.stats, "items_consumed:jl") == b"250"
    client.close()


class AckFailsOnce(Exception):
    pass


@deferred_f_from_coro_f
async def test_a_batch_recorded_but_not_acknowledged_is_not_written_twice(
    redis_url, tmp_path, monkeypatch
):
    """The consumer dies between the file's offset record and the acknowledgement."""
    await fill(redis_url, range(1, 101))
    real_ack = ItemStream.ack
    calls = []

    async def dies_once(self: ItemStream, group: str, ids: list[str]) -> Any:
        calls.append(len(ids))
        if len(calls) == 2:  # the second batch: written and recorded, then the process "dies"
            raise AckFailsOnce
        return await real_ack(self, group, ids)

    monkeypatch.setattr(ItemStream, "ack", dies_once)
    path = tmp_path / "items.jl"
    with pytest.raises(AckFailsOnce):
        await consume(redis_url, "s", JsonLinesSink(path), group="jl", batch=30, consumer="c")
    assert lines(path) == list(range(1, 61))  # two batches in the file, one acknowledged
    monkeypatch.setattr(ItemStream, "ack", real_ack)
    report = await consume(
        redis_url, "s", JsonLinesSink(path), group="jl", batch=30, consumer="c", exit_idle=0.2
    )
    assert lines(path) == list(range(1, 101))
    assert report.recovered == 30 and report.consumed == 40


@deferred_f_from_coro_f
async def test_a_batch_written_but_not_recorded_is_cut_and_written_again(redis_url, tmp_path):
    """The consumer dies between the append and the offset record: the tail is cut."""
    await fill(redis_url, range(1, 41))
    path = tmp_path / "items.jl"
    client = redis.asyncio.Redis.from_url(redis_url)
    stream = ItemStream(client, KEYS)
    await stream.join("jl")
    first = await stream.read("jl", "c", 20)  # delivered to c, then c dies mid-write:
    half = "".join(json.dumps({"id": i, "pad": "x" * 200}) + "\n" for i in range(1, 20))
    path.write_text(half + '{"id": 20, "pa')  # part of it in the file, longer than the rest
    (tmp_path / "items.jl.offset").write_text(json.dumps({"length": 0, "batch": []}))
    report = await consume(
        redis_url, "s", JsonLinesSink(path), group="jl", consumer="c", exit_idle=0.2
    )
    assert lines(path) == list(range(1, 41))
    assert report.consumed == 40 and len(first) == 20
    await client.aclose()


class DiesBeforeRecord(BaseException):  # not a sink error the consumer rides out
    pass


class DiesAfterFirstWrite(JsonLinesSink):
    """Dies between a batch's append and its offset record."""

    def _record(self, ids: list[str], length: int | None = None) -> None:
        if ids:
            raise DiesBeforeRecord
        super()._record(ids, length)


@deferred_f_from_coro_f
async def test_a_first_batch_written_but_not_recorded_is_cut_and_written_again(redis_url, tmp_path):
    """The consumer of a new file dies between its first append and its first record: the
    file's length before the first batch was recorded when it was opened."""
    await fill(redis_url, range(1, 41))
    path = tmp_path / "items.jl"
    with pytest.raises(DiesBeforeRecord):
        await consume(redis_url, "s", DiesAfterFirstWrite(path), group="jl", consumer="c")
    assert lines(path) == list(range(1, 41))  # in the file, not recorded nor acknowledged
    report = await consume(
        redis_url, "s", JsonLinesSink(path), group="jl", consumer="c", exit_idle=0.2
    )
    assert lines(path) == list(range(1, 41))
    assert report.consumed == 40


@deferred_f_from_coro_f
async def test_an_sql_table_gets_every_item_once_even_written_twice(redis_url, archive_url):
    await fill(redis_url, range(1, 151))
    sink = SqlSink(archive_url, "s")
    await consume(redis_url, "s", sink, group="sql", batch=40, exit_idle=0.2)
    rows = await asyncio.to_thread(sink.rows)
    await sink.close()
    assert sorted(r["item"]["id"] for r in rows) == list(range(1, 151))
    # a batch delivered again (its acknowledgement lost) is written over itself
    again = SqlSink(archive_url, "s")
    await again.open()
    await again.write([Entry(r["entry_id"], json.dumps(r["item"]).encode()) for r in rows[:40]])
    assert len(await asyncio.to_thread(again.rows)) == 150
    await again.close()


class PairedSink(SqlSink):
    """An SQL sink whose first write waits (at most 30 s) until its pair has a batch too."""

    def __init__(self, url: str, spider: str, mine: asyncio.Event, other: asyncio.Event) -> None:
        super().__init__(url, spider)
        self.mine, self.other = mine, other

    async def write(self, entries: list[Entry]) -> int:
        self.mine.set()
        async with asyncio.timeout(30):
            await self.other.wait()
        return await super().write(entries)


@deferred_f_from_coro_f
async def test_consumers_of_a_group_share_the_work_and_each_group_gets_every_item(
    redis_url, tmp_path
):
    await fill(redis_url, range(1, 301))
    url = f"sqlite:///{tmp_path / 'items.db'}"
    took = asyncio.Event(), asyncio.Event()
    # each holds its first batch until the other has one: the first consumer to read could
    # otherwise take all 300 before the other one's first read (it did on a busy machine)
    one, two = PairedSink(url, "s", took[0], took[1]), PairedSink(url, "s", took[1], took[0])
    jl = JsonLinesSink(tmp_path / "items.jl")
    reports = await asyncio.gather(
        consume(redis_url, "s", one, group="sql", consumer="a", batch=25, exit_idle=0.3),
        consume(redis_url, "s", two, group="sql", consumer="b", batch=25, exit_idle=0.3),
        consume(redis_url, "s", jl, group="jl", batch=25, exit_idle=0.3),
    )
    assert reports[0].consumed + reports[1].consumed == 300
    assert reports[0].consumed and reports[1].consumed  # both took a share
    rows = await asyncio.to_thread(one.rows)
    await one.close()
    assert sorted(r["item"]["id"] for r in rows) == list(range(1, 301))
    assert sorted(lines(tmp_path / "items.jl")) == list(range(1, 301))
    client = redis.Redis.from_url(redis_url)
    assert client.xlen(KEYS.items) == 0
    client.close()


@deferred_f_from_coro_f
async def test_a_consumer_takes_over_what_a_dead_one_left_pending(redis_url, tmp_path):
    await fill(redis_url, range(1, 51))
    client = redis.asyncio.Redis.from_url(redis_url)
    stream = ItemStream(client, KEYS)
    await stream.join("sql")
    left = await stream.read("sql", "dead", 20)  # delivered to a consumer that then died
    url = f"sqlite:///{tmp_path / 'items.db'}"
    sink = SqlSink(url, "s")
    report = await consume(
        redis_url, "s", sink, group="sql", consumer="heir", claim_idle=0, exit_idle=0.3
    )
    assert report.claimed == len(left) == 20
    rows = await asyncio.to_thread(sink.rows)
    await sink.close()
    assert sorted(r["item"]["id"] for r in rows) == list(range(1, 51))
    assert await client.xlen(KEYS.items) == 0
    await client.aclose()


@deferred_f_from_coro_f
async def test_a_consumer_started_before_the_crawl_waits_for_it_to_run_and_end(redis_url, tmp_path):
    sink = JsonLinesSink(tmp_path / "items.jl")
    early = asyncio.ensure_future(consume(redis_url, "s", sink, group="jl", exit_idle=0.1))
    await asyncio.sleep(1.5)
    assert not early.done()  # nothing queued nor committed: the crawl has not started
    await fill(redis_url, range(1, 11))  # it ran (and ended: no worker, nothing queued)
    report = await asyncio.wait_for(early, 30)
    assert report.consumed == 10 and lines(tmp_path / "items.jl") == list(range(1, 11))


@deferred_f_from_coro_f
async def test_a_consumer_waits_for_work_left_while_no_worker_lives(redis_url, tmp_path):
    """Between two runs of a crawl's workers (a restart, a deploy) nobody is alive but
    requests are pending: the crawl has not ended, and the items of the next run come."""
    client = redis.asyncio.Redis.from_url(redis_url)
    queue = RedisQueue(client, KEYS)
    await queue.enqueue([NewEntry(f"fp{i:010d}".encode(), 0, b"{}") for i in range(3)])
    await fill(redis_url, range(1, 6))
    sink = JsonLinesSink(tmp_path / "items.jl")
    job = asyncio.ensure_future(consume(redis_url, "s", sink, group="jl", exit_idle=0.1))
    await asyncio.sleep(1.5)  # its items are in, and idle far longer than 0.1 s
    assert not job.done()  # 3 requests pending: the crawl goes on when a worker comes
    await fill(redis_url, range(6, 9))  # the next run's items
    leases = await queue.lease(3, 60_000)
    await queue.ack([(x.id, x.token) for x in leases])
    report = await asyncio.wait_for(job, 30)
    assert report.consumed == 8 and lines(tmp_path / "items.jl") == list(range(1, 9))
    await client.aclose()


@deferred_f_from_coro_f
async def test_a_consumer_exits_once_a_stopped_crawls_workers_are_gone(redis_url, tmp_path):
    """A continuous crawl never runs out of work (its revisits wait in Redis): with
    ``--exit-idle`` the consumer ran for ever, even after ``scrapy-ha stop``. A stop that a
    worker started after (a resume) does not count; the stopped workers' last acks do
    (they come after the stop: a worker reads it within HA_LEASE_RENEW_INTERVAL)."""
    client = redis.asyncio.Redis.from_url(redis_url)
    queue = RedisQueue(client, KEYS)
    await queue.enqueue([NewEntry(f"fp{i:010d}".encode(), 0, b"{}") for i in range(3)])
    await fill(redis_url, range(1, 4))
    seconds, _ = await client.time()
    minute = seconds // 60
    await client.set(KEYS.stop, (minute - 5) * 60_000)  # stopped 5 minutes ago
    await client.hset(KEYS.run, "resumed", (minute - 1) * 60_000)  # then resumed
    sink = JsonLinesSink(tmp_path / "items.jl")
    job = asyncio.ensure_future(consume(redis_url, "s", sink, group="jl", exit_idle=0.1))
    await asyncio.sleep(1.5)
    assert not job.done()  # workers ran after that stop: requests are left for them
    await client.set(KEYS.stop, seconds * 1000)  # `scrapy-ha stop` now
    await client.hset(KEYS.stats_minutes, "acked:last", minute + 1)  # its workers' last acks
    report = await asyncio.wait_for(job, 30)
    assert report.consumed == 3 and lines(tmp_path / "items.jl") == [1, 2, 3]
    assert (await queue.counts()).pending == 3  # kept for a resume
    await client.aclose()


@deferred_f_from_coro_f
async def test_a_consumer_that_ends_owing_nothing_leaves_its_group(redis_url, archive_url):
    """Each run of an SQL consumer (named host:pid by default) stayed in the group for
    ever: ``status`` said "3 consumer(s)" with none running."""
    await fill(redis_url, range(1, 6))
    for name in ("a", "b"):
        sink = SqlSink(archive_url, "s")
        await consume(redis_url, "s", sink, group="sql", consumer=name, exit_idle=0.1)
    client = redis.asyncio.Redis.from_url(redis_url)
    (group,) = await client.xinfo_groups(KEYS.items)
    assert group["consumers"] == 0 and group["pending"] == 0
    # one that owes entries stays: it finishes them when it starts again under its name
    await fill(redis_url, range(6, 8))
    await client.xreadgroup("sql", "c", {KEYS.items: ">"}, count=1)
    stream = ItemStream(client, KEYS)
    assert not await stream.leave("sql", "c")
    assert [c["name"] for c in await client.xinfo_consumers(KEYS.items, "sql")] == [b"c"]
    await client.aclose()


@deferred_f_from_coro_f
async def test_a_consumer_whose_group_is_taken_away_stops_saying_so(redis_url, tmp_path):
    """``items --undeclare`` cannot always tell a consumer blocked on a quiet stream from
    a gone one (before Redis 7.2 its idle time grows while it waits): the consumer died
    with NOGROUP's traceback."""
    from scrapy_ha.sinks.consumer import GroupGone

    await fill(redis_url, range(1, 3))
    job = asyncio.ensure_future(
        consume(redis_url, "s", JsonLinesSink(tmp_path / "i.jl"), group="jl")
    )
    client = redis.asyncio.Redis.from_url(redis_url)
    for _ in range(300):  # its items written: it waits for more
        if (tmp_path / "i.jl").exists() and lines(tmp_path / "i.jl") == [1, 2]:
            break
        await asyncio.sleep(0.05)
    await client.xgroup_destroy(KEYS.items, "jl")
    with pytest.raises(GroupGone, match="group jl of s was taken away while this consumer"):
        await asyncio.wait_for(job, 30)
    assert await client.xinfo_groups(KEYS.items) == []  # not made again
    await client.aclose()


@deferred_f_from_coro_f
async def test_consumers_that_start_together_on_a_new_table_all_open(archive_url):
    """Each creates the table if it is missing: the ones that lose the race use the winner's."""
    sinks = [SqlSink(archive_url, "s") for _ in range(8)]
    await asyncio.gather(*(sink.open() for sink in sinks))
    await sinks[0].write([Entry("1-0", b'{"id": 1}')])
    assert [r["item"] for r in await asyncio.to_thread(sinks[-1].rows)] == [{"id": 1}]
    for sink in sinks:
        await sink.close()


@deferred_f_from_coro_f
async def test_a_consumer_rides_out_a_redis_restart(tmp_path):
    from tests.conftest import RedisServer

    server = RedisServer(tmp_path / "redis", appendonly=True)
    server.start()
    try:
        url = server.url
        await fill(url, range(1, 101))
        sink = JsonLinesSink(tmp_path / "items.jl")
        task = asyncio.ensure_future(consume(url, "s", sink, group="jl", batch=10, exit_idle=1))
        await asyncio.sleep(0.3)
        server.stop()  # gracefully: the AOF keeps the stream and the group
        await asyncio.sleep(1.5)
        assert not task.done()  # waiting for Redis, not failed
        server.start()
        await fill(url, range(101, 121))
        report = await asyncio.wait_for(task, 60)
        assert lines(tmp_path / "items.jl") == list(range(1, 121))
        assert report.consumed == 120
    finally:
        server.stop()


@deferred_f_from_coro_f
async def test_a_second_consumer_of_one_json_lines_file_fails_at_once_naming_it(
    redis_url, tmp_path
):
    """Two consumers appending to one file overwrite each other's lines: the first holds the
    file's lock for its life, the second fails at start, before it reads anything."""
    await fill(redis_url, range(1, 21))
    path = tmp_path / "items.jl"
    first = JsonLinesSink(path)
    await first.open()
    with pytest.raises(ConfigError, match=rf"{path}.*in use by another consumer"):
        await consume(redis_url, "s", JsonLinesSink(path), group="jl2", exit_idle=0.2)
    client = redis.Redis.from_url(redis_url)
    assert client.xinfo_groups(KEYS.items) == []  # nothing delivered to it, no group made
    client.close()
    await first.close()  # the lock goes with the file (and with a killed process)
    report = await consume(redis_url, "s", JsonLinesSink(path), group="jl2", exit_idle=0.2)
    assert report.consumed == 20 and lines(path) == list(range(1, 21))


@deferred_f_from_coro_f
async def test_a_json_lines_consumer_started_again_by_default_finishes_the_killed_batch(
    redis_url, tmp_path
):
    """Without a consumer name the consumer takes the sink's own (host and path): the same
    after a restart, so it reads again the batch its killed run was delivered."""
    await fill(redis_url, range(1, 41))
    path = tmp_path / "items.jl"
    client = redis.asyncio.Redis.from_url(redis_url)
    stream = ItemStream(client, KEYS)
    await stream.join("jl")
    killed = await stream.read("jl", JsonLinesSink(path).consumer, 10)  # then SIGKILLed
    assert len(killed) == 10
    sink = JsonLinesSink(path)
    report = await asyncio.wait_for(consume(redis_url, "s", sink, group="jl", exit_idle=0.2), 20)
    assert report.consumed == 40 and sorted(lines(path)) == list(range(1, 41))
    assert await client.xlen(KEYS.items) == 0
    await client.aclose()


@deferred_f_from_coro_f
async def test_a_read_whose_reply_was_lost_is_read_again_from_the_consumers_own(
    redis_url, tmp_path
):
    """Redis ran an XREADGROUP and the connection dropped before its reply: the entries are
    pending to this consumer, which reads its own pending entries before new ones."""
    from tests.test_resent_round import dropping

    await fill(redis_url, range(1, 41))
    path = tmp_path / "items.jl"
    async with dropping(redis_url, b"$1\r\n>\r\n") as relay:
        job = consume(relay.url, "s", JsonLinesSink(path), group="jl", batch=10, exit_idle=0.5)
        report = await asyncio.wait_for(job, 20)
    assert relay.dropped == 1
    assert lines(path) == list(range(1, 41)) and report.consumed == 40


@deferred_f_from_coro_f
async def test_an_item_with_a_lone_surrogate_is_written_escaped(tmp_path):
    """Half an emoji cut by an API (a lone surrogate) cannot be UTF-8: its line is written
    with its non-ASCII characters escaped, as JSON allows; before, its batch failed for
    ever and the sink stalled."""
    from scrapy_ha.codec.items import encode_item

    path = tmp_path / "items.jl"
    sink = JsonLinesSink(path)
    await sink.open()
    cut = encode_item({"name": "café \ud83d"}, None)
    await sink.write([Entry("1-0", cut), Entry("2-0", b'{"id": 2}')])
    await sink.close()
    first, second = path.read_bytes().splitlines()
    assert json.loads(first) == {"name": "café \ud83d"} and json.loads(second) == {"id": 2}


@deferred_f_from_coro_f
async def test_an_item_holding_nan_is_set_aside_not_written_as_no_json(redis_url, tmp_path):
    """``NaN`` and ``Infinity`` are no JSON: the file sink wrote them as they were, and a
    strict reader of the file (``jq``, a JSON parser of another language) failed on the
    line; a database sink sets such an item aside, as this one now does."""
    client = redis.asyncio.Redis.from_url(redis_url)
    odd = [{"id": 2, "price": float("nan")}, {"id": 4, "rank": float("inf")}]
    items = [{"id": 1}, odd[0], {"id": 3}, odd[1], *({"id": i} for i in range(5, 400))]
    await ItemStream(client, KEYS).add([json.dumps(item).encode() for item in items])
    path = tmp_path / "items.jl"  # (set aside once it failed alone while others went in)
    sink = JsonLinesSink(path)
    report = await consume(redis_url, "s", sink, group="jl", batch=10, exit_idle=0.2)

    def no_json(name: str) -> None:
        pytest.fail(f"{name} in the file")

    for line in path.read_text().splitlines():
        json.loads(line, parse_constant=no_json)
    assert sorted(lines(path)) == [1, 3, *range(5, 400)]
    assert report.set_aside == 2
    reasons = [fields[b"r"].decode() for _, fields in await client.xrange(KEYS.items_aside)]
    assert len(reasons) == 2 and all("not JSON compliant" in r for r in reasons), reasons
    await client.aclose()


#: A batch written by a consumer whose file may grow by 40 bytes only (a disk nearly full):
#: pwrite writes part of it and says so only by its count.
SHORT_WRITE = """
import asyncio, json, resource, signal, sys
from scrapy_ha.items import Entry, JsonLinesSink
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
path = sys.argv[1]

async def main():
    sink = JsonLinesSink(path)
    await sink.open()
    await sink.write([Entry("1-0", b'{"id": 1}')])
    size = len(open(path, "rb").read())
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 40, resource.RLIM_INFINITY))
    big = [Entry(f"{i}-0", json.dumps({"id": i, "pad": "x" * 30}).encode()) for i in (2, 3)]
    try:
        await sink.write(big)
    except OSError as exc:
        print("refused:", exc)
    await sink.close()

asyncio.run(main())
"""


def test_a_batch_written_in_part_is_not_recorded(tmp_path):
    """Only part of a batch fits (a disk nearly full): the write fails and the file holds
    what its offset file records, whole lines; before, the cut batch was recorded as
    written (and acknowledged: its last item lost, cut in two)."""
    import subprocess
    import sys

    path = tmp_path / "items.jl"
    done = subprocess.run(
        [sys.executable, "-c", SHORT_WRITE, str(path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "refused:" in done.stdout
    recorded = json.loads((tmp_path / "items.jl.offset").read_text())
    assert recorded["length"] == path.stat().st_size
    assert [json.loads(line)["id"] for line in path.read_bytes().splitlines()] == [1]


@deferred_f_from_coro_f
async def test_a_consumer_that_failed_to_open_lets_go_of_the_file(tmp_path):
    """An offset file the file disagrees with refuses the open; once the operator mends it,
    the next open in the same process takes the file (before, the failed open kept the
    lock: "in use by another consumer")."""
    path = tmp_path / "items.jl"
    path.write_text('{"id": 1}\n')
    offset = tmp_path / "items.jl.offset"
    offset.write_text(json.dumps({"length": 99, "batch": []}))
    with pytest.raises(OSError, match="shorter than the 99"):
        await JsonLinesSink(path).open()
    offset.write_text(json.dumps({"length": path.stat().st_size, "batch": []}))
    sink = JsonLinesSink(path)
    assert await sink.open() == []
    await sink.close()


@deferred_f_from_coro_f
async def test_a_sink_that_cannot_open_leaves_no_group_behind(redis_url, tmp_path):
    """A group nobody consumes keeps every item in the stream for ever: a sink that fails to
    open (a mistyped database) must not have made one."""
    await fill(redis_url, range(1, 11))
    url = f"sqlite:///{tmp_path}/no-such-dir/items.db"
    with pytest.raises(Exception, match="unable to open database file"):
        await consume(redis_url, "s", SqlSink(url, "s"), group="sql", exit_idle=0.2)
    client = redis.Redis.from_url(redis_url)
    assert client.xinfo_groups(KEYS.items) == []
    client.close()
    sink = JsonLinesSink(tmp_path / "items.jl")  # the stream holds every item still
    report = await consume(redis_url, "s", sink, group="jl", exit_idle=0.2)
    assert report.consumed == 10 and lines(tmp_path / "items.jl") == list(range(1, 11))


def test_a_consumer_whose_crawl_is_flushed_stops_saying_its_stream_was_deleted(
    redis_url, redis_client, tmp_path
):
    """A consumer blocked on a quiet stream that `scrapy-ha flush` deleted died with a
    traceback (``ResponseError: UNBLOCKED the stream key no longer exists``)."""
    import subprocess
    import time

    from tests.cli_seed import SCRAPY_HA, _run, scrapy_ha

    _run(fill(redis_url, range(1, 3)))
    path = tmp_path / "i.jl"
    base = [SCRAPY_HA, "items", "s", "--to", f"jsonl:{path}", "--redis-url", redis_url]
    proc = subprocess.Popen(base, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def blocked() -> bool:  # its items written, it waits in XREADGROUP for more
        return any(
            c["cmd"] == "xreadgroup" and "b" in c["flags"] for c in redis_client.client_list()
        )

    deadline = time.monotonic() + 60
    while not (path.exists() and lines(path) == [1, 2] and blocked()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    flushed = scrapy_ha("flush", "s", "--yes", "--redis-url", redis_url)
    assert flushed.returncode == 0, flushed.stderr
    out, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
    assert "error: the item stream of s was deleted while this consumer ran" in err
    assert proc.returncode == 1
    assert not redis_client.exists(KEYS.items)  # not made again behind the flush
