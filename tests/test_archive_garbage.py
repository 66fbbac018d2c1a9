"""Garbage in dead-letter records never keeps the rest of a batch out of the SQL archive:
each row falls back on what can be read, and a row the database refuses costs that entry
alone. SQLite and a real PostgreSQL, the real CLI, a real redis-server."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import sqlalchemy

from scrapy_ha.deadletters.archive import Archive
from scrapy_ha.keys import Keys
from tests.test_archive import rows
from tests.test_dlq import cli

KEYS = Keys("ha", "faults")
GOOD = {"class": "gone", "reason": "HTTP 404", "status": 404, "first": 1000, "last": 2000}
#: entry id -> its record: one good, the others garbage each its own way
RECORDS = {
    "1": GOOD,
    "2": {**GOOD, "first": 1e20},  # before: OSError/OverflowError, the whole batch failed
    "3": {**GOOD, "attempts": "garbage", "history": "not a list"},
    "4": {**GOOD, "status": 10**12, "attempts": 10**12},  # past PostgreSQL's INTEGER
    "5": {**GOOD, "class": "c" * 100, "reason": "nul \x00 in it"},  # PostgreSQL refused both
    "6": {**GOOD, "history": [{"t": float("nan")}]},  # PostgreSQL's JSON refuses NaN
}


def seconds(when: datetime) -> float:
    """*when* in seconds since the epoch (SQLite gives back naive UTC times)."""
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def dead_letters(redis_client, records: dict[str, dict]) -> None:
    for entry_id, info in records.items():
        redis_client.zadd(KEYS.dead, {entry_id: 5000 + int(entry_id)})
        redis_client.hset(KEYS.dead_info, entry_id, json.dumps(info))
        payload = {"v": 1, "u": f"http://x.example/{entry_id}"}
        redis_client.hset(KEYS.payload, entry_id, json.dumps(payload))


def test_a_bad_record_is_archived_with_fallbacks_and_its_batch_too(
    redis_url, redis_client, archive_url
):
    dead_letters(redis_client, RECORDS)
    done = cli(redis_url, "dlq", "archive", "faults", "--url", archive_url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("copied 6 of 6 dead letter(s)"), done.stdout
    assert "Traceback" not in done.stderr
    found = rows(archive_url)
    assert set(found) == set(RECORDS)
    assert seconds(found["1"]["first_failure"]) == 1
    assert seconds(found["2"]["first_failure"]) == 5.002  # its dead-letter time
    assert found["3"]["history"] == [] and isinstance(found["3"]["attempts"], int)
    assert (found["4"]["status"], found["4"]["attempts"]) == (None, 0)
    assert found["5"]["failure_class"] == "c" * 64 and found["5"]["reason"] == "nul \\x00 in it"
    assert found["6"]["history"] == [{"t": None}]
    # archived, so retention and purge may let them go
    purged = cli(redis_url, "dlq", "purge", "faults", "--all", "--yes")
    assert purged.returncode == 0, purged.stderr
    assert redis_client.zcard(KEYS.dead) == 0


def refuse_reasons_with(archive_url: str, word: str) -> None:
    """The archive's table refuses rows whose reason holds *word* (as an operator's CHECK
    constraint or trigger would)."""
    archive = Archive(archive_url)
    archive.create()
    table = archive.table.name
    if archive_url.startswith("sqlite"):
        ddl = (
            f"CREATE TRIGGER refuse BEFORE INSERT ON {table} WHEN NEW.reason LIKE '%{word}%' "
            f"BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
    else:
        ddl = f"ALTER TABLE {table} ADD CONSTRAINT refuse CHECK (reason NOT LIKE '%{word}%')"
    try:
        with archive.engine.begin() as conn:
            conn.execute(sqlalchemy.text(ddl))
    finally:
        archive.close()


def test_a_row_the_database_refuses_costs_that_entry_alone(redis_url, redis_client, archive_url):
    """Before: the batch's one transaction failed, and none of its entries was archived."""
    refuse_reasons_with(archive_url, "refuse-me")
    dead_letters(redis_client, {"1": GOOD, "2": {**GOOD, "reason": "refuse-me"}, "3": GOOD})
    done = cli(redis_url, "dlq", "archive", "faults", "--url", archive_url)
    assert done.returncode == 2
    assert done.stdout.startswith("copied 2 of 3 dead letter(s)"), done.stdout
    assert "the database refused 1 dead letter(s)" in done.stderr
    assert "\n  2: IntegrityError" in done.stderr and "Traceback" not in done.stderr
    assert set(rows(archive_url)) == {"1", "3"}
    purged = cli(redis_url, "dlq", "purge", "faults", "--all", "--yes")
    assert redis_client.zrange(KEYS.dead, 0, -1) == [b"2"], purged.stdout  # kept: not archived


def test_a_database_that_is_unreachable_is_said_plainly(redis_url, redis_client, tmp_path):
    dead_letters(redis_client, {"1": GOOD})
    url = f"sqlite:///{tmp_path}/no/such/folder/failed.db"
    done = cli(redis_url, "dlq", "archive", "faults", "--url", url)
    assert done.returncode == 2
    assert done.stderr.startswith("error: archive sqlite:///") and "Traceback" not in done.stderr
