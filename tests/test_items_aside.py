"""An entry a sink can never write costs that entry alone: the batch around it is written in
pieces, every other item reaches the sink once, and the entry is set aside once, with its
reason, only after it failed alone 3 times while the sink committed other entries. A sink
down for everything (with any error), or flapping with a transient one, sets nothing
aside."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import pytest
import redis
import redis.asyncio
import sqlalchemy
from scrapy import Spider
from scrapy.exceptions import DropItem
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.items import SqlSink, consume
from scrapy_ha.keys import Keys
from scrapy_ha.sinks.jsonl import JsonLinesSink
from scrapy_ha.sinks.pipelines import PipelinesSink, current_entry
from scrapy_ha.store.items import ItemStream

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from scrapy_ha.sinks.consumer import ConsumerReport, Sink

KEYS = Keys("ha", "s")
ASIDE = "ha:{s}:items_aside"  # the key reference.md documents
POISON = 5
#: Seconds a consumer may go without committing the item the test just added.
STEP = 30.0


async def fill(client: Any, ids: list[int]) -> list[str]:
    """Add items ``{"id": i}``; return their entry ids."""
    before = {i for i, _ in await client.xrange(KEYS.items)}
    await ItemStream(client, KEYS).add([json.dumps({"id": i}).encode() for i in ids])
    return [i.decode() for i, _ in await client.xrange(KEYS.items) if i not in before]


def consumed(group: str) -> Callable[[Any], Awaitable[int]]:
    async def read(client: Any) -> int:
        return int(await client.hget(KEYS.stats, f"items_consumed:{group}") or 0)

    return read


async def feed_until_aside(client: Any, group: str, first: int, limit: int = 12) -> list[int]:
    """Add one item at a time, each once the group consumed the one before (the sink
    works), until the group set something aside; return the ids added."""
    added: list[int] = []
    count = consumed(group)
    for n in range(first, first + limit):
        if await client.xlen(ASIDE):
            return added
        before = await count(client)
        await fill(client, [n])
        added.append(n)
        for _ in range(int(STEP / 0.02)):
            if await count(client) > before or await client.xlen(ASIDE):
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError(f"item {n} was not consumed: the sink stalls")
    raise AssertionError(f"nothing set aside after {limit} more items")


async def run(redis_url: str, sink: Sink, group: str, work: Callable[[], Awaitable[Any]]) -> Any:
    """Consume into *sink* while *work* runs; stop the consumer then; its report."""
    stop = asyncio.Event()
    task = asyncio.ensure_future(
        consume(redis_url, "s", sink, group=group, batch=100, block=0.1, stop=stop)
    )
    try:
        await work()
    finally:
        stop.set()
    report: ConsumerReport = await task
    return report


def aside(redis_url: str) -> list[dict[bytes, bytes]]:
    client = redis.Redis.from_url(redis_url)
    rows = [fields for _, fields in client.xrange(ASIDE)]
    client.close()
    return rows


def refusing_table(url: str) -> None:
    """The items table with a CHECK the poison item breaks: a constraint of the database."""
    engine = sqlalchemy.create_engine(url)
    item_id = "json_extract(item, '$.id')" if url.startswith("sqlite") else "(item->>'id')::int"
    with engine.begin() as conn:
        conn.execute(
            sqlalchemy.text(
                "CREATE TABLE scrapy_ha_items (spider VARCHAR(200) NOT NULL, entry_id "
                "VARCHAR(64) NOT NULL, item JSON NOT NULL, committed_at TIMESTAMP WITH TIME "
                f"ZONE NOT NULL, PRIMARY KEY (spider, entry_id), CHECK ({item_id} <> {POISON}))"
            )
        )
    engine.dispose()


def stored(sink: SqlSink) -> list[int]:
    items = [row["item"] for row in sink.rows()]
    sink.engine.dispose()  # the consumer closed it; rows() connected again
    return sorted((json.loads(i) if isinstance(i, str) else i)["id"] for i in items)


@deferred_f_from_coro_f
async def test_an_item_the_table_refuses_is_set_aside_and_every_other_item_is_stored_once(
    redis_url, archive_url
):
    refusing_table(archive_url)
    client = redis.asyncio.Redis.from_url(redis_url)
    ids = await fill(client, list(range(1, 11)))
    sink = SqlSink(archive_url, "s")
    added: list[int] = []

    async def work() -> None:
        added.extend(await feed_until_aside(client, "sql", 11))

    report = await run(redis_url, sink, "sql", work)
    assert stored(sink) == sorted(set(range(1, 11)) - {POISON} | set(added))
    (row,) = aside(redis_url)
    assert row[b"e"].decode() == ids[POISON - 1] and row[b"g"] == b"sql"
    assert b"IntegrityError" in row[b"r"] and json.loads(row[b"i"]) == {"id": POISON}
    assert report.set_aside == 1
    assert await client.xlen(KEYS.items) == 0  # every entry acknowledged
    assert await client.hget(KEYS.stats, "items_aside:sql") == b"1"
    await client.aclose()


class Store:
    """A pipeline that stores items by their entry (idempotent) and refuses some."""

    items: dict[str, Any] = {}
    refuse: Callable[[Any], BaseException | None] = staticmethod(lambda item: None)
    calls = 0

    def process_item(self, item: Any) -> Any:
        Store.calls += 1
        error = Store.refuse(item)
        if error is not None:
            raise error
        Store.items[str(current_entry())] = item
        return item


def pipelines_sink() -> PipelinesSink:
    Store.items, Store.calls = {}, 0
    settings = {"ITEM_PIPELINES": {f"{__name__}.Store": 100}}
    crawler = get_crawler(Spider, settings)
    return PipelinesSink(crawler, Spider("s"))


def refuse_poison(item: Any) -> BaseException | None:
    return ValueError("price is not a number") if item["id"] == POISON else None


@deferred_f_from_coro_f
async def test_an_item_a_pipeline_raises_on_is_set_aside_and_the_others_go_through(redis_url):
    sink = pipelines_sink()
    Store.refuse = staticmethod(refuse_poison)
    client = redis.asyncio.Redis.from_url(redis_url)
    await fill(client, list(range(1, 11)))
    added: list[int] = []

    async def work() -> None:
        added.extend(await feed_until_aside(client, "p", 11))

    await run(redis_url, sink, "p", work)
    ids = sorted(item["id"] for item in Store.items.values())
    assert ids == sorted(set(range(1, 11)) - {POISON} | set(added))
    (row,) = aside(redis_url)
    assert row[b"r"] == b"ValueError: price is not a number"
    await client.aclose()


@pytest.mark.parametrize(
    ("error", "tries"),
    # a transient error is not cut into pieces (a few batches, 0.5 s more apart each); an
    # error the consumer cannot classify is: single entries fail alone, again and again
    [(ConnectionRefusedError("backend down"), 4), (RuntimeError("backend gone"), 20)],
)
@deferred_f_from_coro_f
async def test_a_sink_down_for_everything_sets_nothing_aside(redis_url, error, tries):
    """Down with a transient error, or with one the consumer cannot classify: no entry
    fails while another commits, so none is set aside; all arrive once it is back."""
    sink = pipelines_sink()
    down = [True]
    Store.refuse = staticmethod(lambda item: error if down[0] else None)
    client = redis.asyncio.Redis.from_url(redis_url)
    await fill(client, list(range(1, 21)))

    async def work() -> None:
        while Store.calls < tries:  # tried again and again
            await asyncio.sleep(0.02)
        assert await client.xlen(ASIDE) == 0
        down[0] = False
        count = consumed("p")
        while await count(client) < 20:
            await asyncio.sleep(0.02)

    await run(redis_url, sink, "p", work)
    assert sorted(item["id"] for item in Store.items.values()) == list(range(1, 21))
    assert aside(redis_url) == []
    await client.aclose()


class Flapping(SqlSink):
    """A database that fails every other write with a lost connection."""

    writes = 0

    def _write(self, entries: list[Any]) -> int:
        self.writes += 1
        if self.writes % 2:
            raise ConnectionResetError("server closed the connection")
        return super()._write(entries)


class Down(SqlSink):
    """A database that refuses every connection (as its server down): the batch sizes it
    was handed, one per write."""

    sizes: list[int]

    def _write(self, entries: list[Any]) -> int:
        self.sizes.append(len(entries))
        raise ConnectionRefusedError("connection refused")


@deferred_f_from_coro_f
async def test_a_table_that_is_down_gets_one_write_of_the_whole_batch_per_round(
    redis_url, tmp_path
):
    """A transient error is first the table's: a down database (each write a connect
    timeout) gets one write of the batch per round, and once the batch failed in 3 rounds
    (TRANSIENT_HALVE_AFTER: it may be one item's) 2 a round: the batch and one half, whose
    failure with nothing committed leaves the other half for the next round; not 9 (10, 5,
    2, 1 ...)."""
    sink = Down(f"sqlite:///{tmp_path / 'items.db'}", "s")
    sink.sizes = []
    client = redis.asyncio.Redis.from_url(redis_url)
    await fill(client, list(range(1, 11)))

    async def work() -> None:
        while len(sink.sizes) < 9:  # 3 halving rounds past TRANSIENT_HALVE_AFTER (3)
            await asyncio.sleep(0.02)

    report = await run(redis_url, sink, "sql", work)
    assert sink.sizes[:9] == [10, 10, 10, 5, 10, 5, 10, 5, 10], sink.sizes
    assert report.lone_failures == 0 and aside(redis_url) == []
    await client.aclose()


@deferred_f_from_coro_f
async def test_a_flapping_sink_sets_nothing_aside(redis_url, tmp_path):
    sink = Flapping(f"sqlite:///{tmp_path / 'items.db'}", "s")
    client = redis.asyncio.Redis.from_url(redis_url)

    async def work() -> None:
        count = consumed("sql")
        for first in range(1, 60, 6):  # batches of 6, each tried until its write succeeds
            await fill(client, list(range(first, first + 6)))
            while await count(client) < first + 5:
                await asyncio.sleep(0.02)

    await run(redis_url, sink, "sql", work)
    assert stored(sink) == list(range(1, 61))
    assert aside(redis_url) == []
    assert sink.writes > 10
    await client.aclose()


def read_only(url: str, on: bool) -> None:
    """Make the PostgreSQL database read-only (or writable again) as a failover does: new
    sessions default to read-only transactions; the open ones are cut."""
    engine = sqlalchemy.create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        db = conn.execute(sqlalchemy.text("SELECT current_database()")).scalar()
        flag = "on" if on else "off"
        conn.execute(sqlalchemy.text("SET default_transaction_read_only = off"))  # this one
        conn.execute(
            sqlalchemy.text(f'ALTER DATABASE "{db}" SET default_transaction_read_only = {flag}')
        )
        conn.execute(
            sqlalchemy.text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        )
    engine.dispose()


def most_deliveries(client: redis.Redis, group: str) -> int:
    if not any(g["name"].decode() == group for g in client.xinfo_groups(KEYS.items)):
        return 0
    rows = client.xpending_range(KEYS.items, group, "-", "+", 100)
    return max((row["times_delivered"] for row in rows), default=0)


@deferred_f_from_coro_f
async def test_a_read_only_postgresql_sets_nothing_aside_and_gets_everything_back(
    redis_url, postgres_url
):
    """SQLSTATE 25006 (a read-only transaction: a replica promoted in a failover) is
    transient: the batch waits, pending, and is written once the database is writable."""
    sink = SqlSink(postgres_url, "s")
    await sink.open()  # the table exists before the failover
    client = redis.asyncio.Redis.from_url(redis_url)
    sync = redis.Redis.from_url(redis_url)
    await fill(client, list(range(1, 21)))
    read_only(postgres_url, True)

    async def work() -> None:
        while most_deliveries(sync, "sql") < 4:  # tried again and again, read-only
            await asyncio.sleep(0.05)
        assert await client.xlen(ASIDE) == 0
        read_only(postgres_url, False)
        count = consumed("sql")
        while await count(client) < 20:
            await asyncio.sleep(0.02)

    try:
        await run(redis_url, sink, "sql", work)
    finally:
        read_only(postgres_url, False)
    assert stored(sink) == list(range(1, 21))
    assert aside(redis_url) == []
    sync.close()
    await client.aclose()


class AutoReconnect(Exception):  # noqa: N818 (pymongo's name: one faults.py does not know)
    pass


def dedupe_then_store(item: Any) -> BaseException | None:
    """A dedupe pipeline drops every third item; the storage behind it is down."""
    if item["id"] % 3 == 0:
        return DropItem("duplicate")
    return AutoReconnect("connection refused")


@deferred_f_from_coro_f
async def test_items_a_pipeline_drops_are_no_proof_that_a_down_sink_works(redis_url):
    """A write whose items were all dropped stored nothing: the storage is down for every
    other item, so none of them is set aside, however often they fail alone."""
    sink = pipelines_sink()
    Store.refuse = staticmethod(dedupe_then_store)
    client = redis.asyncio.Redis.from_url(redis_url)
    count = consumed("p")

    async def work() -> None:
        for first in range(1, 60, 6):
            await fill(client, list(range(first, first + 6)))
            calls = Store.calls
            while await count(client) < (first + 5) // 3 or Store.calls < calls + 12:
                await asyncio.sleep(0.02)  # the dropped ones went through, the others failed
            assert await client.xlen(ASIDE) == 0

    await run(redis_url, sink, "p", work)
    assert aside(redis_url) == [] and Store.items == {}
    await client.aclose()


@pytest.mark.parametrize("kind", ["sql", "jsonl"])
@deferred_f_from_coro_f
async def test_an_entry_that_is_not_an_item_is_set_aside_not_dropped(redis_url, tmp_path, kind):
    """Bytes that are not UTF-8, or not JSON, are no item any sink can read: set aside at
    once with the decoding error, byte for byte, never acknowledged and lost."""
    bad = [b'{"name": "caf\xe9"}', b"{not json"]
    sink: Sink = (
        SqlSink(f"sqlite:///{tmp_path / 'items.db'}", "s")
        if kind == "sql"
        else JsonLinesSink(tmp_path / "items.jsonl")
    )
    client = redis.asyncio.Redis.from_url(redis_url)
    await ItemStream(client, KEYS).add([b'{"id": 1}', *bad, b'{"id": 3}'])

    async def work() -> None:
        while await client.xlen(KEYS.items):  # every entry acknowledged (or set aside)
            await asyncio.sleep(0.02)

    report = await run(redis_url, sink, kind, work)
    rows = aside(redis_url)
    assert [row[b"i"] for row in rows] == bad and report.set_aside == 2
    assert all(row[b"r"].startswith(b"CodecError: the item is not JSON") for row in rows)
    assert report.consumed == 2
    await client.aclose()


@deferred_f_from_coro_f
async def test_an_entry_without_an_item_field_is_set_aside_not_taken_for_deleted(
    redis_url, tmp_path
):
    """A stream entry written without the item's field ``i`` (by hand) was taken for one
    deleted while pending: acknowledged, counted consumed, in no sink and never said (QA)."""
    sink = JsonLinesSink(tmp_path / "items.jsonl")
    client = redis.asyncio.Redis.from_url(redis_url)
    await ItemStream(client, KEYS).add([b'{"id": 1}'])
    await client.xadd(KEYS.items, {"x": "no item here"})
    await ItemStream(client, KEYS).add([b'{"id": 3}'])

    async def work() -> None:
        while await client.xlen(KEYS.items):  # every entry acknowledged (or set aside)
            await asyncio.sleep(0.02)

    report = await run(redis_url, sink, "jsonl", work)
    rows = aside(redis_url)
    assert len(rows) == 1 and report.set_aside == 1 and report.consumed == 2, rows
    assert rows[0][b"r"] == b"the stream entry holds no item (no field 'i')", rows
    await client.aclose()


@deferred_f_from_coro_f
async def test_the_crawls_last_item_the_table_refuses_is_set_aside_and_exit_idle_exits(
    redis_url, tmp_path
):
    """Nothing commits after the last item: with a constraint of the table (the entry's own
    fault) failing it alone 3 times and nothing else pending, it is set aside without that
    proof, and the consumer started with --exit-idle exits."""
    url = f"sqlite:///{tmp_path / 'items.db'}"
    refusing_table(url)
    client = redis.asyncio.Redis.from_url(redis_url)
    await fill(client, list(range(1, POISON + 1)))  # the poison is the crawl's last item
    sink = SqlSink(url, "s")
    async with asyncio.timeout(120):  # a guard: it never exited before
        report = await consume(redis_url, "s", sink, group="sql", block=0.1, exit_idle=0.2)
    assert stored(sink) == list(range(1, POISON))
    (row,) = aside(redis_url)
    assert json.loads(row[b"i"]) == {"id": POISON} and b"IntegrityError" in row[b"r"]
    assert report.set_aside == 1 and await client.xlen(KEYS.items) == 0
    await client.aclose()


@deferred_f_from_coro_f
async def test_exit_idle_exits_when_only_unproven_items_stay_pending(redis_url, caplog):
    """A last item a pipeline fails alone with its own exception (not the entry's fault for
    sure: no set-aside without proof) stays pending, and --exit-idle exits saying so."""
    sink = pipelines_sink()
    Store.refuse = staticmethod(refuse_poison)
    client = redis.asyncio.Redis.from_url(redis_url)
    await fill(client, list(range(1, POISON + 1)))
    async with asyncio.timeout(120):  # a guard: it never exited before
        report = await consume(redis_url, "s", sink, group="p", block=0.1, exit_idle=0.2)
    assert sorted(item["id"] for item in Store.items.values()) == list(range(1, POISON))
    assert aside(redis_url) == [] and report.set_aside == 0
    assert (await client.xpending(KEYS.items, "p"))["pending"] == 1
    assert "1 item(s) stay pending in group p" in caplog.text
    await client.aclose()


def refuse_poison_transiently(item: Any) -> BaseException | None:
    return ConnectionResetError("the API drops this one") if item["id"] == POISON else None


@deferred_f_from_coro_f
async def test_a_pipelines_transient_error_on_one_item_holds_back_no_other(redis_url):
    """A pipeline that fails one item with a transient error (an API that cuts the
    connection on it): after 3 failed batches in a row the batch is written in halves
    anyway, so every other item goes through; that item is never set aside."""
    sink = pipelines_sink()
    Store.refuse = staticmethod(refuse_poison_transiently)
    client = redis.asyncio.Redis.from_url(redis_url)
    await fill(client, list(range(1, 11)))
    count = consumed("p")

    async def work() -> None:
        async with asyncio.timeout(STEP * 2):  # a guard: nothing went through before
            while await count(client) < 9:
                await asyncio.sleep(0.02)
        calls = Store.calls
        while Store.calls < calls + 3:  # the poison, tried again and again alone
            await asyncio.sleep(0.02)

    await run(redis_url, sink, "p", work)
    assert sorted(item["id"] for item in Store.items.values()) == sorted(
        set(range(1, 11)) - {POISON}
    )
    assert aside(redis_url) == []
    assert (await client.xpending(KEYS.items, "p"))["pending"] == 1
    await client.aclose()


class StallingTable:
    """A shared table whose writes wait on a lock (a partitioned database), then commit."""

    shares = True
    released: asyncio.Event
    rows: dict[str, Any]

    async def open(self) -> list[str]:
        return []

    async def write(self, entries: list[Any]) -> int:
        await StallingTable.released.wait()
        StallingTable.rows.update((e.id, e.plain()) for e in entries)
        return len(entries)

    async def close(self) -> None:
        pass


@deferred_f_from_coro_f
async def test_consumers_taking_over_a_hung_write_set_nothing_aside(redis_url):
    """Five live consumers of a stalled table take each other's entries over (--claim-idle)
    again and again: nobody died, and the hung writes commit every entry in the end, so
    none may be set aside (it was, 'the consumer died writing it', and was in the table
    too). The death rule is off unless asked for (--deaths)."""
    StallingTable.released, StallingTable.rows = asyncio.Event(), {}
    client = redis.asyncio.Redis.from_url(redis_url)
    sync = redis.Redis.from_url(redis_url)
    await fill(client, list(range(10)))
    stop = asyncio.Event()
    tasks = [
        asyncio.ensure_future(
            consume(
                redis_url,
                "s",
                StallingTable(),
                group="sql",
                consumer=f"c{n}",
                batch=100,
                block=0.05,
                claim_idle=0.3,
                stop=stop,
            )  # fmt: skip
        )
        for n in range(5)
    ]
    try:
        while most_deliveries(sync, "sql") < 5 and not await client.xlen(ASIDE):
            await asyncio.sleep(0.05)  # taken over by each of the 4 others (3 set it aside)
        StallingTable.released.set()
        while await client.xlen(KEYS.items):
            await asyncio.sleep(0.02)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    assert aside(redis_url) == []
    assert sorted(v["id"] for v in StallingTable.rows.values()) == list(range(10))
    sync.close()
    await client.aclose()
