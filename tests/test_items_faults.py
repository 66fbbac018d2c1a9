"""Whose fault a sink's error is (scrapy_ha/sinks/faults.py), for the drivers' own
exception classes: transient errors never count against an entry."""

from __future__ import annotations

import sqlite3

import psycopg
import pytest
import sqlalchemy

from scrapy_ha.sinks.faults import Fault, classify


def wrapped(orig: Exception) -> Exception:
    """As SQLAlchemy raises it."""
    return sqlalchemy.exc.DBAPIError.instance("INSERT", {}, orig, psycopg.Error)


@pytest.mark.parametrize(
    ("error", "fault"),
    [
        (wrapped(psycopg.errors.ReadOnlySqlTransaction()), Fault.TRANSIENT),  # 25006
        (wrapped(psycopg.errors.AdminShutdown()), Fault.TRANSIENT),  # 57P01
        (wrapped(psycopg.errors.SerializationFailure()), Fault.TRANSIENT),  # 40001
        (wrapped(psycopg.errors.DiskFull()), Fault.TRANSIENT),  # 53100
        (wrapped(psycopg.OperationalError("connection refused")), Fault.TRANSIENT),
        (wrapped(psycopg.errors.UniqueViolation()), Fault.ENTRY),  # 23505
        (wrapped(psycopg.errors.CheckViolation()), Fault.ENTRY),  # 23514
        (wrapped(psycopg.errors.NumericValueOutOfRange()), Fault.ENTRY),  # 22003
        (wrapped(sqlite3.OperationalError("database is locked")), Fault.TRANSIENT),
        (
            wrapped(sqlite3.OperationalError("attempt to write a readonly database")),
            Fault.TRANSIENT,
        ),
        (wrapped(sqlite3.IntegrityError("CHECK constraint failed")), Fault.ENTRY),
        (ConnectionRefusedError("backend down"), Fault.TRANSIENT),
        (OSError(28, "No space left on device"), Fault.TRANSIENT),
        (UnicodeEncodeError("utf-8", "\ud83d", 0, 1, "surrogates not allowed"), Fault.ENTRY),
        (RuntimeError("a pipeline's own"), Fault.UNKNOWN),
    ],
)
def test_whose_fault(error, fault):
    assert classify(error) is fault
