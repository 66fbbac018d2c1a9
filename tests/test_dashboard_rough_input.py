"""What the dashboard is given that no page of its own makes: an id whose shard is a
Unicode digit, an id holding a space, a page size of 0, a crawl whose table cannot be read.
Each is answered with a 4xx that says why, never a 500. A real redis-server, the real app."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import redis
from scrapy.utils.defer import deferred_f_from_coro_f

from tests.test_dashboard_actions import _drive, confirm_form, dead_ids, dead_letters
from tests.test_dashboard_api import _url, dashboard, form_token, seed_dead
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


def test_what_redis_holds_by_hand_is_shown_and_what_a_script_sends_is_a_4xx(redis_client):
    """Each of these was a 500 (a hostile QA sweep): a dead-letter record that is JSON but
    no object (the whole table, and ``dlq list``), a history that is no list of objects, a
    header field that is no object, a URL whose host Python cannot read, a time or a count
    of 400 digits (the overview and every crawl's charts); and from a client, a time filter
    of spaces or past year 9999 once in local time, JSON nested 100,000 deep, an id that
    is a lone surrogate."""
    import json
    import subprocess
    import time

    from tests.test_cli import SCRAPY_HA

    seed_dead(redis_client, 4, spider="odd")
    huge = "9" * 400
    redis_client.hset("ha:{odd}:dead_info", "0", "null")
    redis_client.hset("ha:{odd}:dead_info", "1", json.dumps({"class": "gone", "history": "ab"}))
    redis_client.hset("ha:{odd}:payload", "1", json.dumps({"v": 1, "u": "https://[::1/", "h": 7}))
    at_the_end = {"class": "gone", "first": 2**63 - 1, "history": [{"t": 2**63 - 1}, 7]}
    redis_client.hset("ha:{odd}:dead_info", "2", json.dumps(at_the_end))
    redis_client.hset("ha:{odd}:gates", "a.example", huge)
    redis_client.hset("ha:{odd}:stats:min", f"acked:{int(time.time()) // 60}", huge)
    with dashboard(_url(redis_client)) as http:
        for path in ("/", "/api/crawls", "/crawls/odd", "/api/crawls/odd", "/crawls/odd/dead"):
            assert http.get(path).status_code == 200, (path, http.get(path).text[-300:])
        listed = http.get("/api/crawls/odd/dead").json()["entries"]
        assert {e["id"] for e in listed} == {"0", "1", "2", "3"}
        for entry in ("0", "1", "2"):
            page = http.get(f"/crawls/odd/dead/{entry}")
            assert page.status_code == 200, (entry, page.text[-300:])
        assert http.get("/api/crawls/odd/dead", params={"since": "  "}).status_code == 200
        for far in ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"):
            assert http.get("/api/crawls/odd/dead", params={"until": far}).status_code == 400
        url = "/api/crawls/odd/actions/purge"
        deep = b'{"a":' * 100_000
        json_type = {"Content-Type": "application/json"}
        assert http.post(url, content=deep, headers=json_type).status_code == 400
        surrogate = b'{"ids": ["\\ud800"]}'  # JSON's escape of a lone surrogate
        assert http.post(url, content=surrogate, headers=json_type).status_code == 400
        # an id holding a tab, which the form refuses and sends to the API: taken (review)
        tabbed = http.post(url, json={"ids": ["0\t1"], "dry_run": True})
        assert tabbed.status_code == 200 and tabbed.json()["missing"] == 1, tabbed.text
    assert redis_client.zcard("ha:{odd}:dead") == 4
    listing = subprocess.run(
        [SCRAPY_HA, "--redis-url", _url(redis_client), "dlq", "list", "odd"],
        capture_output=True,
        text=True,
    )
    assert listing.returncode == 0 and "unreadable info" in listing.stdout, listing.stderr
