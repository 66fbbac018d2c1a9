"""Consumers that die: an item whose write kills the consumer process is set aside after it
killed 3 single writes, and a consumer SIGKILLed at any point around a set-aside loses
nothing and writes nothing twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import redis
import sqlalchemy

from scrapy_ha.demo.harness import wait_for
from tests.test_items_aside import POISON, refusing_table
from tests.test_items_sink_kills import fill

if TYPE_CHECKING:
    from pathlib import Path

ASIDE, TRIES, ITEMS = "ha:{s}:items_aside", "ha:{s}:items_tries", "ha:{s}:items"
KILLER = 7


def start(redis_url: str, db_url: str, killer: int, log: Path) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "tests.aside_consumer", redis_url, db_url, str(killer)]
    with log.open("ab") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))


def ids_in(db_url: str) -> list[int]:
    engine = sqlalchemy.create_engine(db_url)
    with engine.connect() as conn:
        rows = conn.execute(sqlalchemy.text("SELECT item FROM scrapy_ha_items")).all()
    engine.dispose()
    return sorted((json.loads(r[0]) if isinstance(r[0], str) else r[0])["id"] for r in rows)


def test_an_item_that_kills_the_consumer_is_set_aside_after_three_deaths(redis_url, tmp_path):
    fill(redis_url, 30)
    db_url, log = f"sqlite:///{tmp_path / 'items.db'}", tmp_path / "consumer.log"
    codes = []
    for _ in range(6):  # the test starts it again each time it dies
        proc = start(redis_url, db_url, KILLER, log)
        codes.append(proc.wait(timeout=120))
        if codes[-1] == 0:
            break
    # dies in its batch, then in 3 single writes of the killer; the 5th sets it aside
    assert codes == [3, 3, 3, 3, 0], log.read_text()
    assert ids_in(db_url) == [i for i in range(1, 31) if i != KILLER]
    client = redis.Redis.from_url(redis_url)
    (entry,) = client.xrange(ASIDE)
    assert entry[1][b"r"] == b"the consumer died writing it"
    assert json.loads(entry[1][b"i"]) == {"id": KILLER}
    assert client.xlen(ITEMS) == 0 and client.hlen(TRIES) == 0
    client.close()


def consumed(client: redis.Redis) -> int:
    return int(client.hget("ha:{s}:stats", "items_consumed:sql") or 0)


def feed_one(client: redis.Redis, item_id: int) -> None:
    """One more item, and wait until the consumer commits it (or sets something aside)."""
    before = consumed(client)
    client.eval(
        "return redis.call('XADD', KEYS[1], '*', 'i', ARGV[1])",
        1,
        ITEMS,
        json.dumps({"id": item_id}),
    )
    wait_for(lambda: consumed(client) > before or client.xlen(ASIDE), "progress", 60, 0.002)


def test_consumers_killed_around_a_set_aside_lose_nothing_and_write_nothing_twice(
    redis_url, tmp_path
):
    """A table that refuses one item: the consumer is SIGKILLed 6 times while the test feeds
    it one item at a time (in a batch, a single write, a write in halves), then fed until it
    sets the item aside and SIGKILLed at once (right after the script); a last run ends."""
    db_url, log = f"sqlite:///{tmp_path / 'items.db'}", tmp_path / "consumer.log"
    refusing_table(db_url)
    fill(redis_url, 10)
    client = redis.Redis.from_url(redis_url)
    add = 11
    for kill in range(6):
        proc = start(redis_url, db_url, 0, log)
        feed_one(client, add)
        add += 1
        time.sleep(0.001 * kill)  # somewhere after its commit
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert client.xlen(ASIDE) == 0  # no process lived to see 3 proven failures
    proc = start(redis_url, db_url, 0, log)
    while not client.xlen(ASIDE):
        feed_one(client, add)
        add += 1
        assert add < 40, "not set aside"
    proc.send_signal(signal.SIGKILL)  # right after the script
    proc.wait()
    last = start(redis_url, db_url, 0, log)
    assert last.wait(timeout=120) == 0, log.read_text()
    assert client.xlen(ASIDE) == 1, "the refused item set aside once"
    (entry,) = client.xrange(ASIDE)
    assert json.loads(entry[1][b"i"]) == {"id": POISON}
    assert ids_in(db_url) == [i for i in range(1, add) if i != POISON]
    assert client.xlen(ITEMS) == 0
    client.close()
