"""The item outbox's scenario of the chaos suite (chaos/items.py), full size: 3 workers and
10,000 items, 8 random SIGKILLs of workers, one worker frozen past its leases, an SQL
consumer SIGKILLed twice mid-batch: every item exactly once in every sink. The short version
(1,000 items, 3 kills) runs in `make test` with the other short scenarios
(tests/test_chaos_short.py)."""

from __future__ import annotations

import gc
import os
import sqlite3
import sys
from pathlib import Path

import pytest
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from chaos.items import WORKER_EXTRA, Sinks  # noqa: E402
from chaos.run import Cluster, run_scenario  # noqa: E402

STATS, STREAM = "ha:{chaos}:stats", "ha:{chaos}:items"


@pytest.mark.long  # about 2 minutes here: `make test-long`
def test_every_item_once_in_every_sink_under_kills_a_freeze_and_sink_kills() -> None:
    result = run_scenario("items", short=False)
    assert result["expected"] == 10_000, result
    assert (result["jsonl_lost"], result["jsonl_twice"]) == (0, 0), result
    assert (result["sql_lost"], result["sql_twice"]) == (0, 0), result
    assert result["committed"] == 10_000 and result["left_in_stream"] == 0, result
    assert result["sink_kills_mid_batch"] == 2, result
    assert result["ok"], result


def test_a_worker_restarted_after_the_crawl_finished_commits_no_item_again(
    tmp_path: Path,
) -> None:
    """A kill timed after the short crawl's end restarts a worker into a finished crawl: it
    must not crawl the site again (every item committed twice, the short scenario's tally
    failing with 1,000 items twice in each sink)."""
    c = Cluster(tmp_path, pages=5)
    c.extra = dict(WORKER_EXTRA)
    try:
        c.start_redis()
        c.start_site()
        c.start_worker(0)
        c.wait_workers()
        client = redis.Redis(port=c.redis_port)
        assert int(client.hget(STATS, "items") or 0) == 100
        c.start_worker(1)
        c.wait_workers()
        assert int(client.hget(STATS, "items") or 0) == 100
        assert client.xlen(STREAM) == 100
        client.close()
    finally:
        c.stop_all()


def test_the_tally_closes_the_sql_sinks_database(tmp_path: Path) -> None:
    """Python 3.13 warns of a database left open (the suite makes warnings errors): the
    tally's connection is closed when it has read, not when the collector finds it."""
    database = tmp_path / "sink.db"
    with sqlite3.connect(database) as db:
        db.execute("CREATE TABLE scrapy_ha_items (item TEXT)")
        db.execute("""INSERT INTO scrapy_ha_items VALUES ('{"id": 7}')""")
    db.close()
    sinks = Sinks(Cluster(tmp_path, pages=1), f"sqlite:///{database}")

    def open_on_it() -> list[str]:
        fds = Path("/proc/self/fd")
        return [n for n in os.listdir(fds) if os.path.realpath(fds / n) == str(database)]

    gc.disable()  # a connection left open lives in a cycle: no collection may close it here
    try:
        assert sinks.sql_ids() == [7]
        assert open_on_it() == []
    finally:
        gc.enable()
