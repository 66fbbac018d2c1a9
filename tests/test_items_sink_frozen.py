"""An item consumer writing into a SQL sink whose database freezes (a real PostgreSQL
stopped with SIGSTOP: it accepts bytes and never answers) stops on Ctrl-C, as ``dlq
archive`` does: its batch under way is never finished, and what it did not commit is
delivered again to the next consumer."""

from __future__ import annotations

import signal
import subprocess
import time
from typing import TYPE_CHECKING

import sqlalchemy

from scrapy_ha.demo.harness import wait_for
from scrapy_ha.keys import Keys
from scrapy_ha.sinks.sql import DEFAULT_TABLE
from tests.cli_seed import SCRAPY_HA, dead_letters, scrapy_ha
from tests.test_archive_frozen import exited, frozen

if TYPE_CHECKING:
    import redis

    from tests._postgres import PostgresServer

KEYS = Keys("ha", "shop")
#: Items in the stream: many batches, so that the freeze comes mid-copy.
ITEMS = 20_000


def stored(url: str) -> int:
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as conn:
            query = sqlalchemy.text(f"SELECT count(DISTINCT entry_id) FROM {DEFAULT_TABLE}")
            return int(conn.execute(query).one()[0])
    except sqlalchemy.exc.ProgrammingError:  # no table yet
        return 0
    finally:
        engine.dispose()


def test_an_item_consumer_stops_on_ctrl_c_when_its_database_freezes(
    redis_url: str,
    redis_client: redis.Redis,
    postgres_server: PostgresServer,
    postgres_url: str,
) -> None:
    dead_letters(redis_url, "shop", [("http://a.test/1", "gone", 404)])  # the crawl is there
    base = ("--redis-url", redis_url, "items", "shop", "--to", postgres_url)
    assert scrapy_ha(*base, "--declare").returncode == 0
    pipe = redis_client.pipeline(transaction=False)
    for i in range(ITEMS):  # many batches: the freeze comes mid-copy
        pipe.xadd(KEYS.items, {"i": f'{{"n": {i}}}'})
    pipe.execute()
    proc = subprocess.Popen([SCRAPY_HA, *base], stderr=subprocess.DEVNULL)
    wait_for(lambda: stored(postgres_url) or proc.poll() is not None, "rows", 60)
    assert proc.poll() is None, "the copy ended before the freeze"
    with frozen(postgres_server):  # with the consumer's backend
        time.sleep(0.5)  # the next batch's write is under way
        proc.send_signal(signal.SIGINT)
        time.sleep(1)
        proc.send_signal(signal.SIGINT)  # a second Ctrl-C, as a user does
        returncode = exited(proc)
    assert returncode == 130, "Ctrl-C did not stop the consumer"  # before: it never did

    # what it did not commit is delivered again: each item once (taken over from the
    # stopped consumer, a process of its own, after --claim-idle: 60 s by default)
    again = scrapy_ha(*base, "--exit-idle", "0.2", "--batch", "1000", "--claim-idle", "1")
    assert again.returncode == 0, again.stderr
    assert stored(postgres_url) == ITEMS


def test_a_new_group_whose_sink_never_opened_goes_when_ctrl_c_gives_it_up(
    redis_url: str,
    redis_client: redis.Redis,
    postgres_server: PostgresServer,
    postgres_url: str,
) -> None:
    """A consumer's group made by its start is taken away again when its sink does not
    open, as nothing was read: a group nobody consumes keeps every item in the stream for
    ever. Before, a second Ctrl-C while the sink opened on a frozen database (within its
    connection timeout) left the group behind."""
    dead_letters(redis_url, "shop", [("http://a.test/1", "gone", 404)])  # the crawl is there
    base = ("--redis-url", redis_url, "items", "shop", "--to", postgres_url)

    def groups() -> list[str]:
        if not redis_client.exists(KEYS.items):
            return []
        return [g["name"].decode() for g in redis_client.xinfo_groups(KEYS.items)]

    with frozen(postgres_server):  # the sink's connection waits for an answer
        proc = subprocess.Popen([SCRAPY_HA, *base], stderr=subprocess.DEVNULL)
        wait_for(lambda: groups() or proc.poll() is not None, "the consumer's group", 60)
        assert proc.poll() is None, "the consumer ended before its sink opened"
        time.sleep(0.5)  # its sink is opening
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)  # a second Ctrl-C gives the opening up
        returncode = exited(proc)
    assert returncode == 130
    assert groups() == []  # before: ['sql:...'], nobody's, holding every item
