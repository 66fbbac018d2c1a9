"""A consumer of the item stream that was killed (SIGKILL, an OOM kill) cannot leave its
group: ``scrapy-ha status`` counted it as a consumer for ever. A shared sink's consumers are
named ``host:pid``, so each one killed and started again added a name: 8 consumers killed
during a run, none running, and the sink's line said "8 consumer(s)". A consumer now takes
out of its group, at its start and when it takes over entries another left, the names that
owe nothing and have read nothing for ``claim_idle``."""

from __future__ import annotations

import asyncio
import json

import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.items import Entry, consume
from scrapy_ha.keys import Keys
from scrapy_ha.store.items import ItemStream

KEYS = Keys("ha", "s")


class SharedSink:
    """A sink whose consumers share the work (as an SQL table), kept in memory."""

    shares = True

    def __init__(self) -> None:
        self.ids: list[str] = []

    async def open(self) -> list[str]:
        return []

    async def write(self, entries: list[Entry]) -> int:
        self.ids += [e.id for e in entries]
        return len(entries)

    async def close(self) -> None:
        pass


async def names(client: redis.asyncio.Redis) -> list[bytes]:
    return [c["name"] for c in await client.xinfo_consumers(KEYS.items, "sql")]


@deferred_f_from_coro_f
async def test_a_killed_consumer_whose_entries_were_taken_over_leaves_its_group(redis_url):
    client = redis.asyncio.Redis.from_url(redis_url)
    stream = ItemStream(client, KEYS)
    await stream.join("sql")
    await stream.add([json.dumps({"id": i}).encode() for i in range(1, 6)])
    await client.xreadgroup("sql", "vm:111", {KEYS.items: ">"}, count=3)  # then SIGKILL
    await asyncio.sleep(0.2)
    sink = SharedSink()
    report = await consume(
        redis_url, "s", sink, group="sql", consumer="vm:222", claim_idle=0.1, exit_idle=0.2
    )
    assert report.claimed == 3 and len(sink.ids) == len(set(sink.ids)) == 5
    assert await names(client) == []  # before: [b"vm:111"], "1 consumer(s)" for ever
    await client.aclose()


@deferred_f_from_coro_f
async def test_a_consumer_killed_owing_nothing_leaves_its_group_at_the_next_start(redis_url):
    client = redis.asyncio.Redis.from_url(redis_url)
    stream = ItemStream(client, KEYS)
    await stream.join("sql")
    await stream.add([json.dumps({"id": 1}).encode()])
    for dead in ("vm:111", "vm:112"):  # killed between two batches: they owe nothing
        await client.execute_command("XGROUP", "CREATECONSUMER", KEYS.items, "sql", dead)
    await asyncio.sleep(0.2)
    sink = SharedSink()
    report = await consume(
        redis_url, "s", sink, group="sql", consumer="vm:222", claim_idle=0.1, exit_idle=0.2
    )
    assert report.claimed == 0 and len(sink.ids) == 1  # nothing to take over
    assert await names(client) == []  # before: [b"vm:111", b"vm:112"]
    await client.aclose()
