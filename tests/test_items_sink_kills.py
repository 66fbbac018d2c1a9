"""`scrapy-ha items` processes SIGKILLed while they hold a batch (delivered, not acknowledged)
and started again: the JSON Lines file and the SQL table (SQLite and PostgreSQL) each hold
every item once."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import redis
import sqlalchemy

from scrapy_ha.demo.harness import wait_for
from scrapy_ha.keys import Keys
from scrapy_ha.store.scripts import ITEMS_ADD_LUA

if TYPE_CHECKING:
    from pathlib import Path

KEYS = Keys("ha", "s")
ITEMS = 2000


def fill(redis_url: str, n: int) -> None:
    """*n* items in the stream, as items_add.lua adds them (the test runs in a reactor)."""
    client = redis.Redis.from_url(redis_url)
    add = client.register_script(ITEMS_ADD_LUA)
    for first in range(0, n, 500):
        batch = range(first + 1, min(n, first + 500) + 1)
        add(keys=[KEYS.items, *KEYS.stats_keys()], args=[json.dumps({"id": i}) for i in batch])
    client.close()


def consumer(redis_url: str, to: str, name: str, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "scrapy_ha.cli.cmdline", "items", "s", "--to", to]
    args += ["--redis-url", redis_url, "--consumer", name, "--batch", "40", *extra]
    with log.open("ab") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))


def group_of(client: redis.Redis, prefix: str) -> str:
    for info in client.xinfo_groups(KEYS.items):
        name = info["name"].decode()
        if name.startswith(prefix):
            return name
    raise AssertionError(f"no group {prefix}*")


def held(client: redis.Redis, prefix: str, name: str) -> set[bytes]:
    """The entries the consumer was delivered and has not acknowledged: a batch in hand."""
    try:
        group = group_of(client, prefix)
    except AssertionError:
        return set()
    rows = client.xpending_range(KEYS.items, group, "-", "+", 1000, consumername=name)
    return {row["message_id"] for row in rows}


def kill_mid_batch(
    redis_url: str, to: str, prefix: str, name: str, log: Path, kills: int, *extra: str
) -> int:
    """Run a consumer, SIGKILL it *kills* times while it holds a batch, start it again each
    time under its name; let the last run finish. Returns the kills that hit a batch."""
    client = redis.Redis.from_url(redis_url)
    rng, hit, left = random.Random(33), 0, set()
    for _ in range(kills):
        proc = consumer(redis_url, to, name, log, *extra)
        # it finishes what the last one left first, then takes a batch of its own
        wait_for(lambda old=left: held(client, prefix, name) - old, "a batch", 60, 0.002)
        if rng.random() < 0.5:
            time.sleep(0.001 * rng.randrange(1, 20))  # somewhere in the batch
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        left = held(client, prefix, name)
        hit += bool(left)  # it died holding entries not acknowledged
    last = consumer(redis_url, to, name, log, *extra, "--exit-idle", "0.5")
    assert last.wait(timeout=120) == 0, log.read_text()
    client.close()
    return hit


def test_a_json_lines_consumer_killed_mid_batch_writes_each_item_once(redis_url, tmp_path):
    fill(redis_url, ITEMS)
    path = tmp_path / "items.jl"
    hit = kill_mid_batch(redis_url, f"jsonl:{path}", "jsonl:", "jl", tmp_path / "jl.log", 4)
    assert hit >= 2
    ids = [json.loads(line)["id"] for line in path.read_text().splitlines()]
    assert sorted(ids) == list(range(1, ITEMS + 1)), "an item missing or written twice"


def test_an_sql_consumer_killed_mid_batch_writes_each_item_once(redis_url, archive_url, tmp_path):
    fill(redis_url, ITEMS)
    hit = kill_mid_batch(redis_url, archive_url, "sql:", "sql", tmp_path / "sql.log", 4)
    assert hit >= 2
    engine = sqlalchemy.create_engine(archive_url)
    with engine.connect() as conn:
        rows = conn.execute(sqlalchemy.text("SELECT item FROM scrapy_ha_items")).all()
    engine.dispose()
    ids = [(json.loads(r[0]) if isinstance(r[0], str) else r[0])["id"] for r in rows]
    assert sorted(ids) == list(range(1, ITEMS + 1)), "an item missing or written twice"
    client = redis.Redis.from_url(redis_url)
    assert client.xlen(KEYS.items) == 0
    client.close()
