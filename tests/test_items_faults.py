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


def named(*names: str) -> Exception:
    """An exception whose classes have *names* (the first its own, the others its bases),
    as a library's (aiohttp, Twisted, urllib3) that the test does not import."""
    base: type[Exception] = Exception
    for name in reversed(names):
        base = type(name, (base,), {})
    return base("network down")


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
        (wrapped(psycopg.errors.LockNotAvailable()), Fault.TRANSIENT),  # 55P03
        (wrapped(psycopg.errors.ObjectInUse()), Fault.TRANSIENT),  # 55006
        (wrapped(psycopg.errors.ConfigFileError()), Fault.TRANSIENT),  # F0000, Operational
        (wrapped(psycopg.errors.DataCorrupted()), Fault.UNKNOWN),  # XX001, InternalError
        (named("ServerDisconnectedError", "ClientConnectionError", "ClientError"), Fault.TRANSIENT),
        (named("ConnectionRefusedError", "ConnectError"), Fault.TRANSIENT),  # twisted's
        (named("ConnectionLost"), Fault.TRANSIENT),
        (named("ResponseNeverReceived", "_WrapperException"), Fault.TRANSIENT),
        (named("MaxRetryError", "RequestError", "PoolError", "HTTPError"), Fault.TRANSIENT),
        (named("ProtocolError", "HTTPError"), Fault.TRANSIENT),
    ],
)
def test_whose_fault(error, fault):
    assert classify(error) is fault
