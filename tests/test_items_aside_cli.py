"""`scrapy-ha items SPIDER --to SINK --aside` lists what the group set aside, and
`--retry-aside` writes it to the sink, each record deleted only once the sink committed its
item; a record the sink cannot read (not UTF-8) or whose group is gone is kept."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from typing import Any

import redis
import redis.asyncio
import sqlalchemy
from scrapy import Spider
from scrapy.exceptions import DropItem
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.cli.aside import retry_aside
from scrapy_ha.keys import Keys
from scrapy_ha.sinks.consumer import ItemConsumer
from scrapy_ha.sinks.jsonl import JsonLinesSink
from scrapy_ha.sinks.pipelines import PipelinesSink, current_entry
from scrapy_ha.store.items import reason_text
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.scripts import ITEMS_ADD_LUA, ITEMS_ASIDE_LUA
from tests.cli_seed import scrapy_ha
from tests.test_items_sink_kills import fill

KEYS = Keys("ha", "s")
ASIDE = "ha:{s}:items_aside"
NOT_UTF8 = b'\xff\xfe{"id": 9}\x80'


def set_aside(client: redis.Redis, group: str, reason: str) -> list[str]:
    """Deliver every entry to consumer c of *group*, set aside the 2nd and the last (the
    consumers' own script); their ids."""
    client.xgroup_create(KEYS.items, group, id="0")
    ids = [i.decode() for i, _ in client.xreadgroup(group, "c", {KEYS.items: ">"})[0][1]]
    script = client.register_script(ITEMS_ASIDE_LUA)
    keys = [KEYS.items, KEYS.items_aside, KEYS.items_tries, *KEYS.stats_keys()]
    for entry in (ids[1], ids[-1]):
        done = script(keys=keys, args=[group, "c", entry, reason_text(reason), f"{entry} {group}"])
        assert done[0] == 1
    return [ids[1], ids[-1]]


def test_aside_lists_and_retry_aside_writes_and_keeps_what_it_cannot(redis_url, tmp_path):
    fill(redis_url, 3)
    client = redis.Redis.from_url(redis_url)
    client.xadd(KEYS.items, {"i": NOT_UTF8})
    good, bad = set_aside(client, "g", "IntegrityError: prix refusé")
    db = f"sqlite:///{tmp_path / 'items.db'}"
    args = ["items", "s", "--to", db, "--group", "g", "--redis-url", redis_url]
    shown = scrapy_ha(*args, "--aside")
    assert shown.returncode == 0, shown.stderr
    assert f"{good}  " in shown.stdout and f"{bad}  " in shown.stdout
    assert "IntegrityError: prix refusé" in shown.stdout
    assert "2 entries set aside by group g" in shown.stdout
    assert client.xrange(ASIDE)[1][1][b"i"] == NOT_UTF8  # byte for byte
    status = scrapy_ha("status", "s", "--redis-url", redis_url)
    assert "sink  g: backlog 2, consumed 0, set aside 2 in all, 1 consumer(s)" in status.stdout
    assert "aside 2 (`--aside` lists them)" in status.stdout
    retried = scrapy_ha(*args, "--retry-aside")
    assert retried.returncode == 1, retried.stderr
    assert "1 set-aside entry written, 1 kept" in retried.stdout
    assert f"{bad}: the sink cannot read it" in retried.stdout
    status = scrapy_ha("status", "s", "--redis-url", redis_url)  # the records still waiting
    assert "aside 1 (`--aside` lists them)" in status.stdout, status.stdout
    engine = sqlalchemy.create_engine(db)
    with engine.connect() as conn:
        rows = conn.execute(sqlalchemy.text("SELECT entry_id, item FROM scrapy_ha_items")).all()
    engine.dispose()
    assert [(r[0], json.loads(r[1])) for r in rows] == [(good, {"id": 2})]
    ((_, kept),) = client.xrange(ASIDE)
    assert kept[b"e"].decode() == bad and kept[b"i"] == NOT_UTF8
    again = scrapy_ha(*args, "--retry-aside")  # written again under its id: still one row
    assert "0 set-aside entries written, 1 kept" in again.stdout
    client.close()


def test_retry_aside_keeps_the_records_of_a_group_that_no_longer_exists(redis_url, tmp_path):
    fill(redis_url, 3)
    client = redis.Redis.from_url(redis_url)
    set_aside(client, "gone", "ValueError: no")
    client.xgroup_destroy(KEYS.items, "gone")
    db = f"sqlite:///{tmp_path / 'items.db'}"
    args = ["items", "s", "--to", db, "--group", "gone", "--redis-url", redis_url]
    retried = scrapy_ha(*args, "--retry-aside")
    assert retried.returncode == 1
    assert "group gone no longer reads ha:{s}:items: 2 kept" in retried.stdout
    assert client.xlen(ASIDE) == 2
    client.close()


KILLED_RETRY = """
import os, signal, sys
from scrapy_ha.cli import main
from scrapy_ha.store.items import ItemStream

async def killed(self, record_id):  # SIGKILL once the sink committed, before the deletion
    os.kill(os.getpid(), signal.SIGKILL)

ItemStream.drop_aside = killed
sys.argv = ["scrapy-ha", *sys.argv[1:]]
sys.exit(main())
"""


def test_retry_aside_into_a_file_killed_before_the_deletion_writes_nothing_twice(
    redis_url, tmp_path
):
    """A JSON Lines file's offset file names the batch it committed last: a --retry-aside
    killed between the commit and the record's deletion deletes the record at the next
    run, and does not append the item again."""
    fill(redis_url, 3)
    client = redis.Redis.from_url(redis_url)
    set_aside(client, "g", "OSError: disk full")
    path = tmp_path / "items.jsonl"
    args = ["items", "s", "--to", f"jsonl:{path}", "--group", "g", "--redis-url", redis_url]
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_RETRY, *args, "--retry-aside"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"id": 2}]
    again = scrapy_ha(*args, "--retry-aside")
    assert again.returncode == 0, again.stderr
    assert "2 set-aside entries written, 0 kept" in again.stdout
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [{"id": 2}, {"id": 3}] and client.xlen(ASIDE) == 0
    client.close()


def test_retry_aside_with_id_writes_only_those_and_skips_a_record_that_blocks(redis_url, tmp_path):
    """A record the sink keeps failing (or cannot read) need not block the others:
    ``--id`` retries only the entries named; an id not set aside is said and exits 1."""
    fill(redis_url, 3)
    client = redis.Redis.from_url(redis_url)
    client.xadd(KEYS.items, {"i": NOT_UTF8})
    good, bad = set_aside(client, "g", "IntegrityError: no")
    db = f"sqlite:///{tmp_path / 'items.db'}"
    args = ["items", "s", "--to", db, "--group", "g", "--redis-url", redis_url]
    retried = scrapy_ha(*args, "--retry-aside", "--id", good)
    assert retried.returncode == 0, retried.stderr
    assert "1 set-aside entry written, 0 kept" in retried.stdout
    ((_, kept),) = client.xrange(ASIDE)
    assert kept[b"e"].decode() == bad
    unknown = scrapy_ha(*args, "--retry-aside", "--id", "1-1")
    assert unknown.returncode == 1
    assert "1-1: no such entry set aside by group g" in unknown.stdout
    assert client.xlen(ASIDE) == 1
    client.close()


def test_retry_aside_into_a_file_keeps_a_record_it_could_not_write_at_every_run(
    redis_url, tmp_path
):
    """A record the file cannot hold (not UTF-8) is left out and kept; the offset file
    names only the lines written, so the next --retry-aside keeps it again (it deleted it,
    taking it for one a killed run had written: in neither place)."""
    fill(redis_url, 3)
    client = redis.Redis.from_url(redis_url)
    client.xadd(KEYS.items, {"i": NOT_UTF8})
    good, bad = set_aside(client, "g", "OSError: disk full")
    path = tmp_path / "items.jsonl"
    args = ["items", "s", "--to", f"jsonl:{path}", "--group", "g", "--redis-url", redis_url]
    for written in (1, 0):
        retried = scrapy_ha(*args, "--retry-aside")
        assert retried.returncode == 1, retried.stderr
        assert f"{written} set-aside entr" in retried.stdout, retried.stdout
        assert f"{bad}: the sink cannot read it as an item" in retried.stdout
        ((_, kept),) = client.xrange(ASIDE)
        assert kept[b"e"].decode() == bad and kept[b"i"] == NOT_UTF8
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"id": 2}]
    assert json.loads(path.with_name("items.jsonl.offset").read_text())["batch"] == [good]
    client.close()


def test_a_table_that_refuses_everything_sets_nothing_aside_and_exit_idle_exits_1(
    redis_url, tmp_path
):
    """A table whose every write fails with SQLSTATE 23 (a CHECK no row passes, as a broken
    trigger): the sink's fault, not the entries'. Nothing was ever stored, so the no-proof
    rule of the crawl's last item does not apply: every item stays pending, --exit-idle
    exits 1 with its WARNING (every item was set aside before, exit 0)."""
    fill(redis_url, 5)
    db = tmp_path / "items.db"
    with sqlite3.connect(db) as conn:
        conn.execute(
            "CREATE TABLE scrapy_ha_items (spider VARCHAR(200) NOT NULL, entry_id VARCHAR(64) "
            "NOT NULL, item JSON NOT NULL, committed_at TIMESTAMP NOT NULL, PRIMARY KEY "
            "(spider, entry_id), CHECK (json_extract(item, '$.id') < 0))"
        )
    args = ["items", "s", "--to", f"sqlite:///{db}", "--group", "g", "--redis-url", redis_url]
    ran = scrapy_ha(*args, "--exit-idle", "0.2")
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "5 item(s) stay pending in group g" in ran.stderr
    assert "0 set aside" in ran.stdout
    client = redis.Redis.from_url(redis_url)
    assert client.xlen(ASIDE) == 0 and client.xpending(KEYS.items, "g")["pending"] == 5
    client.close()


def test_retry_aside_killed_then_the_files_consumer_then_retry_again_writes_nothing_twice(
    redis_url, tmp_path
):
    """A --retry-aside killed between the file's commit and the record's deletion, then the
    file's consumer writing a batch of its own (the offset file's last batch is then its),
    then --retry-aside again: the offset file's 'retried' names the record's entry, carried
    over by the consumer's batch, so it is deleted, not appended a second time."""
    fill(redis_url, 3)
    client = redis.Redis.from_url(redis_url)
    good, _ = set_aside(client, "g", "OSError: disk full")
    client.xack(KEYS.items, "g", client.xrange(KEYS.items)[0][0])  # item 1: in another file
    client.register_script(ITEMS_ADD_LUA)(keys=[KEYS.items, *KEYS.stats_keys()], args=['{"id": 4}'])
    path = tmp_path / "items.jsonl"
    args = ["items", "s", "--to", f"jsonl:{path}", "--group", "g", "--redis-url", redis_url]
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_RETRY, *args, "--retry-aside", "--id", good],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    consumed = scrapy_ha(*args, "--exit-idle", "0.2")
    assert consumed.returncode == 0, consumed.stderr
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == [2, 4]
    again = scrapy_ha(*args, "--retry-aside")
    assert again.returncode == 0, again.stderr
    assert "2 set-aside entries written, 0 kept" in again.stdout
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == [2, 4, 3]
    assert client.xlen(ASIDE) == 0
    client.close()


class Dedupe:
    """An idempotent pipeline: drops an item it stored before under the same entry (a
    --retry-aside killed between the write and the record's deletion)."""

    seen: set[str] = set()

    def process_item(self, item: Any) -> Any:
        entry = str(current_entry())
        if entry in Dedupe.seen:
            raise DropItem("already stored under this entry")
        Dedupe.seen.add(entry)
        return item


@deferred_f_from_coro_f
async def test_retry_aside_deletes_a_record_whose_item_a_pipeline_drops(redis_url, capsys):
    """A dropped item is through, as the consumer acknowledges it: its record is deleted
    and counted apart, and the run exits 0 (it was kept, exit 1 at every run)."""
    fill(redis_url, 3)
    sync = redis.Redis.from_url(redis_url)
    ids = set_aside(sync, "p", "ValueError: pipeline bug")
    Dedupe.seen = {ids[0]}  # stored before the kill; the other record is written now
    client = redis.asyncio.Redis.from_url(redis_url)
    queue = RedisQueue(client, KEYS)
    crawler = get_crawler(Spider, {"ITEM_PIPELINES": {f"{__name__}.Dedupe": 100}})
    runner = ItemConsumer(queue, PipelinesSink(crawler, Spider("s")), group="p")
    code = await retry_aside(queue, runner)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "1 set-aside entry written, 1 dropped by the pipelines (deleted), 0 kept" in out
    assert sync.xlen(ASIDE) == 0 and Dedupe.seen == set(ids)
    await client.aclose()
    sync.close()


@deferred_f_from_coro_f
async def test_retry_aside_into_a_file_keeps_its_journal_short_within_a_run(redis_url, tmp_path):
    """Each record deleted leaves the offset file's ``retried`` list at the next write: the
    list no longer grows with every record of a run (each write rewrote and fsynced it all:
    4,000 records took 11.5 s)."""
    fill(redis_url, 3)
    sync = redis.Redis.from_url(redis_url)
    ids = set_aside(sync, "g", "OSError: disk full")
    client = redis.asyncio.Redis.from_url(redis_url)
    queue = RedisQueue(client, KEYS)
    path = tmp_path / "items.jsonl"
    code = await retry_aside(queue, ItemConsumer(queue, JsonLinesSink(path), group="g"))
    assert code == 0 and sync.xlen(ASIDE) == 0
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"id": 2}, {"id": 3}]
    offset = json.loads((tmp_path / "items.jsonl.offset").read_text())
    assert offset["retried"] == [ids[-1]]  # the first record's id left at the second write
    await client.aclose()
    sync.close()


def test_aside_lists_each_record_on_one_line_whatever_its_reason_holds(redis_url):
    """A reason is an exception's text, which may hold a page's text: its carriage return
    wrote the rest of the line over the entry's id in a terminal, and its newline made a
    line that looked like another record (reasons are one line, as `dlq list` shows them)."""
    fill(redis_url, 3)
    client = redis.Redis.from_url(redis_url)
    forged = "ValueError: bad title ok\r[12:00:00] all items stored\nfake-1  2026-01-01  no\x1b[2J"
    good, bad = set_aside(client, "g", forged)
    shown = scrapy_ha(
        "items", "s", "--to", "jsonl:x.jl", "--group", "g", "--aside", "--redis-url", redis_url
    )
    assert shown.returncode == 0, shown.stderr
    assert "\r" not in shown.stdout
    lines = shown.stdout.splitlines()
    one = "ValueError: bad title ok [12:00:00] all items stored fake-1 2026-01-01 no\\u001b[2J"
    assert [line.split("  ", 2)[::2] for line in lines[:2]] == [[good, one], [bad, one]]
    assert lines[2:] == ["2 entries set aside by group g"]
    client.close()
