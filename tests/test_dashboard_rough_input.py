"""What the dashboard is given that no page of its own makes: an id whose shard is a
Unicode digit, an id holding a space, a page size of 0, a crawl whose table cannot be read.
Each is answered with a 4xx that says why, never a 500. A real redis-server, the real app."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import redis
from scrapy.utils.defer import deferred_f_from_coro_f

from tests.test_dashboard_actions import _drive, confirm_form, dead_ids, dead_letters
from tests.test_dashboard_api import dashboard, form_token, seed_dead
from tests.test_unreadable_crawl import SHARD_HELD, broken_crawls

if TYPE_CHECKING:
    from fastapi.testclient import TestClient


@deferred_f_from_coro_f
async def test_a_shard_written_in_unicode_digits_is_no_shard_not_a_500(redis_url):
    await dead_letters(redis_url, "wide", 6, shards=2)

    def check(http: TestClient) -> None:
        before = dead_ids(http, "wide")
        assert http.get("/api/crawls/wide/dead/\u00b2:1").status_code == 404
        assert http.get("/crawls/wide/dead/\u0661:1").status_code == 404  # Arabic-Indic 1
        for action in ("purge", "requeue"):
            done = http.post(f"/api/crawls/wide/actions/{action}", json={"ids": ["\u00b2:1"]})
            assert done.status_code == 200 and done.json()["touched"] == 0, done.text
        assert dead_ids(http, "wide") == before

    await asyncio.to_thread(_drive, redis_url, check)


def test_an_id_holding_a_space_is_refused_before_its_confirmation(redis_client):
    seed_dead(redis_client, 2, spider="few")
    redis_client.zadd("ha:{few}:dead", {"0 1": 1_700_000_000_100})  # written by hand
    kw = redis_client.connection_pool.connection_kwargs
    with dashboard(f"redis://{kw['host']}:{kw['port']}/{kw['db']}") as http:
        csrf = form_token(http.get("/crawls/few/dead").text)
        asked = http.post("/crawls/few/actions/purge", data={"csrf": csrf, "ids": ["0 1"]})
        assert asked.status_code == 400 and "holds whitespace" in asked.text, asked.text
        every = http.post("/crawls/few/actions/purge", data={"csrf": csrf, "scope": "filter"})
        assert every.status_code == 400 and "'0 1'" in every.text
        assert redis_client.zcard("ha:{few}:dead") == 3  # nothing purged, "0" and "1" kept
        fine = http.post("/crawls/few/actions/purge", data={"csrf": csrf, "ids": ["1"]})
        done = http.post("/crawls/few/actions/purge", data=confirm_form(fine.text))
        assert "Purged 1 of 1 entry." in done.text, done.text


def test_a_page_size_of_0_reads_one_row(redis_client):
    seed_dead(redis_client, 3, spider="few")
    kw = redis_client.connection_pool.connection_kwargs
    with dashboard(f"redis://{kw['host']}:{kw['port']}/{kw['db']}") as http:
        page = http.get("/api/crawls/few/dead", params={"size": 0}).json()
        assert [e["id"] for e in page["entries"]] == ["2"], page


@deferred_f_from_coro_f
async def test_the_table_entry_and_action_of_an_unreadable_crawl_name_the_key(redis_url):
    await broken_crawls(redis_url)  # ha:{wide:1}:dead holds a string

    def check(http: TestClient) -> None:
        csrf = form_token(http.get("/crawls/live").text)
        answers: list[Any] = [
            http.get("/crawls/wide/dead"),
            http.get("/api/crawls/wide/dead"),
            http.get("/api/crawls/wide/dead/1:1"),
            http.get("/crawls/wide"),
            http.post("/api/crawls/wide/actions/purge", json={"filter": {}, "all": True}),
            http.post("/crawls/wide/actions/purge", data={"csrf": csrf, "scope": "filter"}),
        ]
        for answer in answers:
            assert answer.status_code == 409, (answer.request.url, answer.text)
            assert SHARD_HELD in answer.text

    await asyncio.to_thread(_drive, redis_url, check)
    assert redis.Redis.from_url(redis_url).get("ha:{wide:1}:dead") == b"x"
