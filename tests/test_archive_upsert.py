"""How the archive's upsert counts and locks: on a SQLite without ``INSERT ... RETURNING``
(before 3.35), and with two writers of the same entries on a real PostgreSQL."""

from __future__ import annotations

import sqlite3
import threading
from typing import Any

from sqlalchemy import event

from scrapy_ha.deadletters.archive import Archive
from scrapy_ha.deadletters.dlq import DeadEntry


def entry(entry_id: str, reason: str = "HTTP 404") -> DeadEntry:
    return DeadEntry(entry_id, f"http://x/{entry_id}", "gone", reason, 1_700_000_000_000)


def refuse_returning(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
    """What SQLite before 3.35 says of a RETURNING clause."""
    if " RETURNING " in statement.upper():
        raise sqlite3.OperationalError('near "RETURNING": syntax error')


def test_a_sqlite_without_returning_archives_and_counts_the_new_rows(monkeypatch, tmp_path):
    """SQLite 3.24 to 3.34 knows ON CONFLICT but not RETURNING. Simulated (the library
    here is 3.40; an older one is not installable next to it): SQLAlchemy reads the
    library's version from the driver, told 3.34.1, and the statements that reach the
    library are refused as an old one refuses them. Before: the batch got that syntax
    error, taken for the database being down (an OperationalError): nothing archived."""
    monkeypatch.setattr(sqlite3.dbapi2, "sqlite_version_info", (3, 34, 1))
    archive = Archive(f"sqlite:///{tmp_path / 'old.db'}")
    event.listen(archive.engine, "before_cursor_execute", refuse_returning)
    try:
        assert not archive.engine.dialect.insert_returning
        archive.create()
        first = archive.write("faults", [entry("a"), entry("b")])
        assert (len(first.entries), first.new, first.errors) == (2, 2, [])
        one = archive.write("faults", [entry("c")])  # a batch of one: not an executemany
        assert (len(one.entries), one.new, one.errors) == (1, 1, [])
        batch = [entry("b", "HTTP 410"), entry("d"), entry("c", "HTTP 410"), entry("e")]
        again = archive.write("faults", batch)
        assert (len(again.entries), again.new, again.errors) == (4, 2, [])
        reasons = {r["entry_id"]: r["reason"] for r in archive.rows("faults")}
    finally:
        archive.close()
    assert reasons == {"a": "HTTP 404", "b": "HTTP 410", "c": "HTTP 410", "d": "HTTP 404"} | {
        "e": "HTTP 404"
    }


#: Entries each writer archives: more than one statement's worth (SQLAlchemy sends 1,000
#: rows a statement), so that the writers' statements overlap.
ENTRIES = 3000
#: Times the two writers race (each a new spider's rows)
ROUNDS = 3


def test_two_writers_of_the_same_entries_in_opposite_orders_do_not_deadlock(postgres_url):
    """Before: each writer locked the rows it inserted in its own order, each waited for a
    row the other held, and PostgreSQL ended one (DeadlockDetected, reported as the
    database being down); the rows are now written in entry id order."""
    archives = [Archive(postgres_url), Archive(postgres_url)]
    archives[0].create()
    try:
        for spider in (f"race{n}" for n in range(ROUNDS)):
            entries = [entry(f"{i:05d}") for i in range(ENTRIES)]
            news = race(archives, spider, [entries, entries[::-1]])
            assert sum(news) == ENTRIES  # each row new to one of them
            assert len(archives[0].rows(spider)) == ENTRIES
    finally:
        for archive in archives:
            archive.close()


def race(archives: list[Archive], spider: str, batches: list[list[DeadEntry]]) -> list[int]:
    """Each archive writes its batch in a thread of its own, both starting together: how
    many rows each found new (an error is raised)."""
    start = threading.Barrier(len(archives))
    news: list[int] = []
    errors: list[BaseException] = []

    def write(archive: Archive, batch: list[DeadEntry]) -> None:
        start.wait()
        try:
            written = archive.write(spider, batch)
            assert not written.errors, written.errors
            news.append(written.new)
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread
            errors.append(exc)

    threads = [
        threading.Thread(target=write, args=pair) for pair in zip(archives, batches, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    if errors:
        raise errors[0]
    return news
