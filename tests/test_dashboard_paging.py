"""Paging a table while workers change it: the entries taken out of the set meanwhile (due
retries a worker promoted, dead letters requeued or purged) move no page past rows it never
showed."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import redis.asyncio
from redis.commands.core import AsyncScript
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.dashboard._tables import BATCH, ID_BATCH, Filter, ShardedTables, Tables
from scrapy_ha.keys import Keys
from tests.cli_seed import delayed, lease_all
from tests.test_dashboard_api import _url, dashboard, seed_dead

#: Rows per page, and due retries a worker's sync promotes between two pages.
PAGE = 50


def test_due_retries_promoted_between_two_pages_make_the_next_page_skip_nothing(redis_client):
    url = _url(redis_client)
    due_now = [(f"http://shop.example/due/{i}", 0, "server") for i in range(PAGE)]
    later = [
        (f"http://shop.example/later/{i}", 3_600_000 + i * 1000, "server") for i in range(2 * PAGE)
    ]
    delayed(url, "shop", due_now + later)
    with dashboard(url) as http:
        first = http.get("/api/crawls/shop/delayed", params={"size": PAGE}).json()
        shown = [e["url"] for e in first["entries"]]
        assert sorted(shown) == sorted(u for u, _, _ in due_now)  # soonest first
        assert len(lease_all(url, "shop")) == PAGE  # a worker's sync takes the due ones
        cursor = first["next_cursor"]
        while cursor is not None:
            params = {"size": PAGE, "cursor": cursor}
            page = http.get("/api/crawls/shop/delayed", params=params).json()
            shown += [e["url"] for e in page["entries"]]
            cursor = page["next_cursor"]
    assert shown[PAGE:] == [u for u, _, _ in later]  # none skipped, in order


class _TakesOutAfterFirstRead:
    """A real client whose first read of a table's members (by rank or by the window
    script) is followed by entries leaving the set below where the reading goes on, as a
    requeue or a promotion does between two batches of one request."""

    def __init__(self, client: Any, key: str, leaving: list[str]) -> None:
        self.client, self.key, self.leaving = client, key, leaving

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def register_script(self, script: str) -> Any:
        return AsyncScript(self, script)

    async def _then(self, found: Any) -> Any:
        if self.leaving:
            await self.client.zrem(self.key, *self.leaving)
            self.leaving = []
        return found

    async def zrange(self, *args: Any, **kwargs: Any) -> Any:
        return await self._then(await self.client.zrange(*args, **kwargs))

    async def evalsha(self, *args: Any, **kwargs: Any) -> Any:
        return await self._then(await self.client.evalsha(*args, **kwargs))

    async def script_load(self, *args: Any) -> Any:
        return await self.client.script_load(*args)


async def _read_while_taken_out(redis_client: Any, n: int, read: Any) -> list[str]:
    seed_dead(redis_client, n)
    real = redis.asyncio.Redis.from_url(_url(redis_client))
    keys = Keys("ha", "big")
    client = _TakesOutAfterFirstRead(real, keys.dead, [str(i) for i in range(100)])
    try:
        return list(await read(Tables(client, keys), keys.dead))
    finally:
        await real.aclose()


@deferred_f_from_coro_f
async def test_entries_leaving_between_two_batches_of_one_page_skip_no_row(redis_client):
    """A page filtered on content reads the table in batches of BATCH: 100 entries taken
    out below it after the first batch made the second start 100 rows too far (ids 1000 to
    1099 never shown)."""

    async def read(tables: Tables, key: str) -> list[str]:
        page = await tables.page(
            key, Filter(status=404), cursor=None, size=3000, newest_first=False
        )
        assert page.next_cursor is None
        return [row.id for row in page.rows]

    assert BATCH == 1000
    shown = await _read_while_taken_out(redis_client, 2500, read)
    assert shown == [str(i) for i in range(2500)]  # (0 to 99 read before they left)


@deferred_f_from_coro_f
async def test_entries_leaving_while_every_id_is_read_skip_no_id(redis_client):
    """ "Requeue all that match" without a filter on content reads the ids in batches of
    ID_BATCH: the second batch started 100 ids too far."""

    async def read(tables: Tables, key: str) -> list[str]:
        return await tables.all_ids(key, Filter())

    shown = await _read_while_taken_out(redis_client, ID_BATCH + 500, read)
    assert shown == [str(i) for i in range(ID_BATCH + 500)]


def _seed_scores(redis_client: Any, keys: Keys, entries: list[tuple[bytes, float]]) -> None:
    """Dead letters of these members and scores (written by hand: any score, any bytes)."""
    pipe = redis_client.pipeline(transaction=False)
    for i, (member, score) in enumerate(entries):
        info = {"class": "gone", "reason": "HTTP 404", "status": 404, "attempts": 1}
        pipe.zadd(keys.dead, {member: score})
        pipe.hset(keys.dead_info, member, json.dumps(info))
        pipe.hset(keys.payload, member, json.dumps({"v": 1, "u": f"http://x/{i}"}))
    pipe.execute()


async def _every_page(tables: Any, where: Any, flt: Filter, size: int, newest: bool) -> list[str]:
    """The ids of every page, following next_cursor (at most 50 pages: a loop ends)."""
    shown: list[str] = []
    cursor = None
    for _ in range(50):
        page = await tables.page(where, flt, cursor=cursor, size=size, newest_first=newest)
        shown += [row.id for row in page.rows]
        if (cursor := page.next_cursor) is None:
            return shown
    raise AssertionError(f"paging did not end: {len(shown)} rows shown, {shown[-5:]}")


#: Members and scores a hand may write: infinite, negative and fractional scores, members
#: that are not UTF-8, with '_' or '.', many in one millisecond.
ODD = (
    [(b"-inf%d" % i, float("-inf")) for i in range(4)]
    + [(b"neg_%d" % i, -2.5 + i) for i in range(3)]
    + [
        (b"same.%02d\xff" % i if i % 4 == 1 else b"same.%02d" % i, 1_700_000_000_000)
        for i in range(9)
    ]
    + [(b"big%d" % i, 1_234_567_890_123_450.0 + i) for i in range(3)]
    + [(b"inf%d" % i, float("inf")) for i in range(5)]
)


def _ids(members: list[bytes]) -> list[str]:
    return [m.decode(errors="backslashreplace") for m in members]


@deferred_f_from_coro_f
async def test_odd_scores_and_members_are_paged_once_each_both_ways(redis_client):
    """A next page after an entry of an infinite score went back to the first entry (a
    loop), newest first past every entry below it; one after a member not UTF-8 went back to
    the first of its millisecond (a loop when more share it than a page shows), and its
    record was looked up by its escaped text: a filter on content never showed it."""
    keys = Keys("ha", "big")
    _seed_scores(redis_client, keys, ODD)
    client = redis.asyncio.Redis.from_url(_url(redis_client))
    tables = Tables(client, keys)
    ordered = _ids([m for m, _ in sorted(ODD, key=lambda e: (e[1], e[0]))])
    try:
        windowed = (Filter(since_ms=-3), ordered[4:])
        for flt, expected in ((Filter(), ordered), windowed, (Filter(status=404), ordered)):
            for size in (1, 2, 3):
                shown = await _every_page(tables, keys.dead, flt, size, False)
                assert shown == expected, (flt, size)
                shown = await _every_page(tables, keys.dead, flt, size, True)
                assert shown == expected[::-1], (flt, size)
    finally:
        await client.aclose()


@deferred_f_from_coro_f
async def test_a_sharded_crawls_odd_scores_are_paged_once_each(redis_client):
    """A sharded crawl's cursor named a shard's next row by the time its row shows (0 for a
    negative score, the year 9999 for an infinite one): not its entry's place."""
    keys = Keys("ha", "big", 0, 2)
    for i, shard in enumerate(keys.every_shard()):
        _seed_scores(redis_client, shard, ODD[i::2])
    client = redis.asyncio.Redis.from_url(_url(redis_client))
    tables = ShardedTables(client, keys.every_shard())
    try:
        for newest in (False, True):
            shown = await _every_page(tables, "dead", Filter(), 2, newest)
            assert sorted(shown) == sorted(set(shown)) and len(shown) == len(ODD), newest
    finally:
        await client.aclose()


@deferred_f_from_coro_f
async def test_every_id_is_read_once_with_infinite_scores_past_a_batch(redis_client):
    """'All that match' went on from the entry past each batch: one of an infinite score
    sent it back to the first batch, for ever (the action never answered)."""
    keys = Keys("ha", "big")
    entries = [(b"%d" % i, 1_700_000_000_000 + i) for i in range(ID_BATCH)]
    _seed_scores(redis_client, keys, entries + [(b"inf%d" % i, float("inf")) for i in range(3)])
    client = redis.asyncio.Redis.from_url(_url(redis_client))
    try:
        found = await asyncio.wait_for(Tables(client, keys).all_ids(keys.dead, Filter()), 20)
    finally:
        await client.aclose()
    assert found == [str(i) for i in range(ID_BATCH)] + ["inf0", "inf1", "inf2"]
