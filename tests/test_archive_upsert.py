"""How the archive's upsert counts: on a SQLite without ``INSERT ... RETURNING`` (before
3.35)."""

from __future__ import annotations

import sqlite3
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
