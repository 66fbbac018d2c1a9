"""A dead-letter action that touches fewer entries than it was given says why the others
were left: gone from the dead-letter queue (requeued or purged meanwhile by another
operator, from the CLI, or the same form sent twice), kept by a purge because an SQL
archive is declared and they are not archived yet, or kept by a requeue because their
stored request is gone, as ``scrapy-ha dlq`` says. FastAPI's TestClient over a real Redis
and the real ``scrapy-ha`` command."""

from __future__ import annotations

import asyncio
import html
import subprocess
from typing import TYPE_CHECKING

import redis
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.deadletters.marks import ARCHIVE_MARK
from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from tests.test_dashboard_actions import _drive, confirm_form, dead_ids, dead_letters
from tests.test_dashboard_api import SCRAPY_HA, delay_one, form_token

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

KEYS = Keys("ha", "shop")


@deferred_f_from_coro_f
async def test_a_stale_confirmation_says_which_entries_were_gone_already(redis_url):
    await dead_letters(redis_url, "shop", 3)

    def check(http: TestClient) -> None:
        first, second, _ = sorted(dead_ids(http, "shop"))
        csrf = form_token(http.get("/crawls/shop/dead").text)
        url = "/crawls/shop/actions/requeue"
        confirm = http.post(url, data={"csrf": csrf, "ids": [first, second]})
        assert "Requeue 2 entries of shop?" in confirm.text
        # meanwhile another operator requeues one of them from a shell
        cli = [SCRAPY_HA, "--redis-url", redis_url, "dlq", "requeue", "shop", first, "--yes"]
        assert subprocess.run(cli, capture_output=True, check=False).returncode == 0
        done = http.post(url, data=confirm_form(confirm.text))
        assert "Requeued 1 of 2 entries; 1 was not in the dead-letter queue" in done.text
        assert "(requeued or purged already" in done.text
        # the same confirmation sent again (a double submit): nothing done, and said
        again = http.post(url, data=confirm_form(confirm.text))
        assert "Requeued 0 of 2 entries; 2 were not in the dead-letter queue" in again.text
        api = http.post("/api/crawls/shop/actions/purge", json={"ids": [first, "no-such"]})
        assert api.json()["touched"] == 0
        assert "2 were not in the dead-letter queue" in api.json()["report"]
        assert len(dead_ids(http, "shop")) == 1

    await asyncio.to_thread(_drive, redis_url, check)


@deferred_f_from_coro_f
async def test_a_purge_kept_for_the_archive_and_a_requeue_without_request_say_so(
    redis_url, redis_client
):
    await dead_letters(redis_url, "shop", 2)
    redis_client.hset(KEYS.dead_archived, ARCHIVE_MARK, "postgresql://db.example/crawl")

    def check(http: TestClient) -> None:
        ids = sorted(dead_ids(http, "shop"))
        purged = http.post("/api/crawls/shop/actions/purge", json={"ids": ids}).json()
        assert purged["touched"] == 0, purged
        assert "2 kept: not archived yet" in purged["report"]
        assert "scrapy-ha dlq archive shop" in purged["report"]
        redis_client.hdel(KEYS.payload, ids[0])  # its stored request deleted by hand
        requeued = http.post("/api/crawls/shop/actions/requeue", json={"ids": ids}).json()
        assert requeued["touched"] == 1, requeued
        assert f"1 kept: its stored request is gone ({ids[0]})" in requeued["report"]
        assert dead_ids(http, "shop") == {ids[0]}

    await asyncio.to_thread(_drive, redis_url, check)


@deferred_f_from_coro_f
async def test_a_report_keeps_the_case_of_what_it_names(redis_url, redis_client):
    await dead_letters(redis_url, "BookShop", 1)
    redis_client.set(Keys("ha", "BookShop").finish_record, "done")  # its end cleared the crawl

    def check(http: TestClient) -> None:
        csrf = form_token(http.get("/crawls/BookShop/dead").text)
        form = {"csrf": csrf, "confirm": "yes", "ids": sorted(dead_ids(http, "BookShop"))}
        done = html.unescape(http.post("/crawls/BookShop/actions/requeue", data=form).text)
        # before: "note: the crawl of bookshop finished ... (scheduler_persist=false)"
        assert "Requeued 1 of 1 entry. Note: the crawl of BookShop finished" in done
        assert "(SCHEDULER_PERSIST=False)" in done and '"Runs"' in done

    await asyncio.to_thread(_drive, redis_url, check)


@deferred_f_from_coro_f
async def test_a_retry_now_of_a_request_a_worker_took_already_says_so(redis_url):
    entry_id = await delay_one(redis_url, "http://shop.example/item/1", 600_000)

    def check(http: TestClient) -> None:
        url = "/api/crawls/slow/actions/retry-now"
        assert http.post(url, json={"ids": [entry_id]}).json()["report"] == (
            "made due now 1 of 1 entry"
        )
        asyncio.run(promote(redis_url))  # a worker's sync takes it
        again = http.post(url, json={"ids": [entry_id, "no-such"]}).json()
        assert again["touched"] == 0
        # before: "made due now 0 of 2 entries", and no more
        assert "2 were not delayed any more (a worker took them already" in again["report"]

    await asyncio.to_thread(_drive, redis_url, check)


async def promote(redis_url: str) -> None:
    """A worker's sync: it leases the due retry."""
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await RedisQueue(client, Keys("ha", "slow")).sync(lease=1, lease_ms=600_000)
    finally:
        await client.aclose()


@deferred_f_from_coro_f
async def test_opening_a_gate_open_already_says_so(redis_url):
    await delay_one(redis_url, "http://shop.example/item/1", 600_000)
    client = redis.asyncio.Redis.from_url(redis_url)
    await RedisQueue(client, Keys("ha", "slow")).close_gate("shop.example", 600_000)
    await client.aclose()

    def check(http: TestClient) -> None:
        url = "/api/crawls/slow/actions/open-gate"
        body = {"ids": ["shop.example"]}
        assert http.post(url, json=body).json()["report"] == "opened 1 of 1 gate"
        # a second operator, or the same form sent twice; before: "opened 0 of 1 gate"
        again = http.post(url, json=body).json()["report"]
        assert again == "opened 0 of 1 gate; 1 was open already", again

    await asyncio.to_thread(_drive, redis_url, check)
