"""Paging a table while workers change it: the entries taken out of the set meanwhile (due
retries a worker promoted, dead letters requeued or purged) move no page past rows it never
showed."""

from __future__ import annotations

from typing import Any

import redis.asyncio
from redis.commands.core import AsyncScript
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.dashboard._tables import BATCH, ID_BATCH, Filter, Tables
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
