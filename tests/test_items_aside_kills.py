"""A sink's consumer SIGKILLed at each point of the bisection of a batch its sink failed
(tests/aside_sink.py) and started again: the JSON Lines file and the SQL table (SQLite and
PostgreSQL) hold each good item exactly once, in the stream's order, and each bad one is set
aside exactly once. Before the set-aside, a batch with a bad entry stalled the sink for
ever (the runs below never reached their kill points, nor the end)."""

from __future__ import annotations

import json
import subprocess
import sys

import redis
import sqlalchemy

from scrapy_ha.keys import Keys
from scrapy_ha.sinks.sql import DEFAULT_TABLE, items_table
from scrapy_ha.store.scripts import ITEMS_ADD_LUA

KEYS = Keys("ha", "s")
ITEMS = 60
#: Three in a row, one alone, two in a row at the batch's end, one in the second batch.
BAD = {3, 4, 5, 17, 38, 39, 55}
GOOD = [i for i in range(1, ITEMS + 1) if i not in BAD]
#: Where each run kills itself (tests/aside_sink.py), in order; the last run ends.
JSONL_KILLS = ["written:1", "recorded:1", "acked:2", "aside:1", "written:3", "asided:1"]
SQL_KILLS = ["recorded:1", "acked:1", "aside:1", "recorded:3", "asided:2"]


def fill(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    add = client.register_script(ITEMS_ADD_LUA)
    items = [json.dumps({"id": i, **({"bad": 1} if i in BAD else {})}) for i in range(1, ITEMS + 1)]
    add(keys=[KEYS.items, *KEYS.stats_keys()], args=["-", *items])
    client.close()


def run(redis_url: str, to: str, kill: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "tests.aside_sink", redis_url, to, kill]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def kill_through(redis_url: str, to: str, kills: list[str]) -> None:
    for kill in kills:
        done = run(redis_url, to, kill)
        assert done.returncode == -9, f"{kill} not reached: {done.stdout}{done.stderr}"
    done = run(redis_url, to, "-")
    assert done.returncode == 0, done.stderr


def set_aside(redis_url: str) -> list[int]:
    client = redis.Redis.from_url(redis_url)
    entries = client.xrange(KEYS.items_aside)
    assert client.xlen(KEYS.items) == 0  # every entry committed or set aside
    client.close()
    assert all(f[b"g"] == b"g" and f[b"r"] for _, f in entries)
    return [json.loads(f[b"i"])["id"] for _, f in entries]


def test_a_json_lines_consumer_killed_during_the_bisection_writes_each_item_once(
    redis_url, tmp_path
):
    fill(redis_url)
    path = tmp_path / "items.jl"
    kill_through(redis_url, f"jsonl:{path}", JSONL_KILLS)
    ids = [json.loads(line)["id"] for line in path.read_text().splitlines()]
    assert ids == GOOD, "an item missing, out of order, or written twice"
    assert sorted(set_aside(redis_url)) == sorted(BAD)


def refuse_bad_items(url: str) -> None:
    """The items table, made beforehand with a rule that refuses an item with "bad"."""
    engine = sqlalchemy.create_engine(url)
    items_table(sqlalchemy, DEFAULT_TABLE).metadata.create_all(engine)
    if engine.dialect.name == "sqlite":
        rule = (
            f"CREATE TRIGGER no_bad BEFORE INSERT ON {DEFAULT_TABLE} WHEN "
            f"json_extract(NEW.item, '$.bad') IS NOT NULL BEGIN SELECT RAISE(ABORT, 'bad'); END"
        )
    else:
        rule = (
            f"ALTER TABLE {DEFAULT_TABLE} ADD CONSTRAINT no_bad CHECK (item::jsonb->'bad' IS NULL)"
        )
    with engine.begin() as conn:
        conn.execute(sqlalchemy.text(rule))
    engine.dispose()


def test_an_sql_consumer_killed_during_the_bisection_writes_each_item_once(redis_url, archive_url):
    fill(redis_url)
    refuse_bad_items(archive_url)
    kill_through(redis_url, archive_url, SQL_KILLS)
    engine = sqlalchemy.create_engine(archive_url)
    with engine.connect() as conn:
        rows = conn.execute(sqlalchemy.text(f"SELECT item FROM {DEFAULT_TABLE}")).all()
    engine.dispose()
    ids = [(json.loads(r[0]) if isinstance(r[0], str) else r[0])["id"] for r in rows]
    assert sorted(ids) == GOOD, "an item missing or written twice"
    assert sorted(set_aside(redis_url)) == sorted(BAD)
