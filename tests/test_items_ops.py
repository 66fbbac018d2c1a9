"""What an operator sees of the item stream: `scrapy-ha status` (text and JSON), the
Prometheus exporter and the dashboard show the items committed and refused, the items in the
stream, and each sink's backlog, read from Redis as the workers' and consumers' scripts
wrote them."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import redis.asyncio
from fastapi.testclient import TestClient

from scrapy_ha.dashboard.app import create_app
from scrapy_ha.keys import Keys
from scrapy_ha.store.items import reason_text
from scrapy_ha.store.scripts import ITEMS_ACK_LUA, ITEMS_ADD_LUA, ITEMS_ASIDE_LUA
from tests.cli_seed import scrapy_ha
from tests.test_metrics import Exporter, value

if TYPE_CHECKING:
    from redis import Redis

KEYS = Keys("ha", "books")


def sinks_behind(client: Redis) -> None:
    """120 items committed; sink "sql" consumed 70 of them and holds 20 unacknowledged,
    sink "jsonl" has read nothing yet; one item was refused (its page's lease was lost)."""
    client.register_script(ITEMS_ADD_LUA)(
        keys=[KEYS.items, *KEYS.stats_keys()], args=[json.dumps({"id": i}) for i in range(120)]
    )
    client.hincrby(KEYS.stats, "items_refused", 1)
    for group in ("sql", "jsonl"):
        client.xgroup_create(KEYS.items, group, id="0")
    read = client.xreadgroup("sql", "a", {KEYS.items: ">"}, count=90)
    ids = [i for i, _ in read[0][1]]
    client.register_script(ITEMS_ACK_LUA)(
        keys=[KEYS.items, *KEYS.stats_keys()], args=["sql", *ids[:70]]
    )


def test_status_shows_the_stream_and_each_sinks_backlog(redis_url, redis_client):
    sinks_behind(redis_client)
    shown = scrapy_ha("status", "books", "--redis-url", redis_url)
    assert shown.returncode == 0, shown.stderr
    assert "items  committed 120  refused 1  in stream 120" in shown.stdout
    assert "sink  jsonl: backlog 120, consumed 0, 0 consumer(s)" in shown.stdout
    assert "sink  sql: backlog 50, consumed 70, 1 consumer(s)" in shown.stdout
    doc = json.loads(scrapy_ha("status", "books", "--json", "--redis-url", redis_url).stdout)
    assert doc["items"]["committed"] == 120 and doc["items"]["backlog"] == 120
    assert {g["name"]: (g["pending"], g["lag"], g["backlog"]) for g in doc["items"]["groups"]} == {
        "jsonl": (0, 120, 120),
        "sql": (20, 30, 50),
    }


def test_the_exporter_exposes_the_backlog_per_sink(redis_url, redis_client):
    sinks_behind(redis_client)
    exporter = Exporter(redis_url)
    try:
        samples = exporter.scrape()
    finally:
        exporter.stop()
    assert value(samples, "scrapy_ha_items_committed_total", spider="books") == 120
    assert value(samples, "scrapy_ha_items_refused_total", spider="books") == 1
    assert value(samples, "scrapy_ha_items_in_stream", spider="books") == 120
    assert value(samples, "scrapy_ha_items_backlog", spider="books", group="sql") == 50
    assert value(samples, "scrapy_ha_items_backlog", spider="books", group="jsonl") == 120
    assert value(samples, "scrapy_ha_items_consumed_total", spider="books", group="sql") == 70


def test_the_exporter_shows_the_set_aside_records_waiting_apart_from_those_ever_set_aside(
    redis_url, redis_client
):
    """Two entries set aside by sink "sql" (its consumers' own script), one written back by
    --retry-aside (its record deleted): the counter says 2 ever, the gauge 1 waiting."""
    sinks_behind(redis_client)
    pending = redis_client.xreadgroup("sql", "a", {KEYS.items: "0"}, count=2)[0][1]
    script = redis_client.register_script(ITEMS_ASIDE_LUA)
    keys = [KEYS.items, KEYS.items_aside, KEYS.items_tries, *KEYS.stats_keys()]
    for entry, _ in pending:
        reason = reason_text("IntegrityError: no")
        assert script(keys=keys, args=["sql", "a", entry, reason, f"{entry!r} sql"])[0] == 1
    redis_client.xdel(KEYS.items_aside, redis_client.xrange(KEYS.items_aside)[0][0])
    exporter = Exporter(redis_url)
    try:
        samples = exporter.scrape()
    finally:
        exporter.stop()
    assert value(samples, "scrapy_ha_items_aside_total", spider="books", group="sql") == 2
    assert value(samples, "scrapy_ha_items_aside_waiting", spider="books") == 1


def test_the_dashboard_shows_the_slowest_sinks_backlog(redis_url, redis_client):
    sinks_behind(redis_client)
    app = create_app(redis.asyncio.Redis.from_url(redis_url), "ha", close_client=True)
    with TestClient(app, base_url="http://127.0.0.1") as http:
        (books,) = http.get("/api/crawls").json()["crawls"]
        assert books["items_backlog"] == 120
        page = http.get("/api/crawls/books").json()
        assert page["items"]["committed"] == 120
        assert {g["name"]: g["backlog"] for g in page["items"]["groups"]} == {
            "jsonl": 120,
            "sql": 50,
        }
        html = http.get("/crawls/books").text
        assert "<h2>Items</h2>" in html and "sql" in html
        assert 'class="items-backlog">120<' in http.get("/").text


def test_a_sink_that_consumed_the_whole_stream_has_no_backlog(redis_url, redis_client):
    """Both sinks consumed all 120 items and the stream is empty, but Redis's read counter
    of each group is behind (as a Redis 7.0 was seen to keep it after a continuous crawl
    with a consumer and Redis SIGKILLed: lag 812 of a stream of 0 entries): before, status
    said "backlog 812" of each sink, and ``items --exit-idle`` never exited."""
    sinks_behind(redis_client)
    ack = redis_client.register_script(ITEMS_ACK_LUA)
    for group in ("sql", "jsonl"):
        while read := redis_client.xreadgroup(group, "a", {KEYS.items: ">"}, count=50):
            ack(keys=[KEYS.items, *KEYS.stats_keys()], args=[group, *[i for i, _ in read[0][1]]])
        pending = redis_client.xpending(KEYS.items, group)["pending"]
        if pending:  # sql's 20 read and not acknowledged
            held = redis_client.xpending_range(KEYS.items, group, "-", "+", pending)
            ack(
                keys=[KEYS.items, *KEYS.stats_keys()],
                args=[group, *[p["message_id"] for p in held]],
            )
    assert redis_client.xlen(KEYS.items) == 0
    last = redis_client.xinfo_stream(KEYS.items)["last-generated-id"]
    for group in ("sql", "jsonl"):  # the counter Redis was seen with: 100 read of 120 added
        redis_client.execute_command("XGROUP", "SETID", KEYS.items, group, last, "ENTRIESREAD", 100)
    assert {g["lag"] for g in redis_client.xinfo_groups(KEYS.items)} == {20}
    doc = json.loads(scrapy_ha("status", "books", "--json", "--redis-url", redis_url).stdout)
    assert doc["items"]["backlog"] == 0
    assert {g["name"]: g["backlog"] for g in doc["items"]["groups"]} == {"jsonl": 0, "sql": 0}
