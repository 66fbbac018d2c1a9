"""Whose fault a sink's failure is: the sink's for now (transient), or the entry's.

A consumer sets an entry aside only when the entry failed alone and the sink demonstrably
worked for other entries meanwhile (:mod:`.isolate`); a failure this module calls transient
never counts against an entry at all. The rules:

- SQL (psycopg, or any driver that gives one): the SQLSTATE of the error. Classes ``08``
  (connection), ``40`` (rollback: serialization, deadlock), ``53`` (insufficient
  resources), ``55`` (object not in prerequisite state: a lock not available, an object in
  use), ``57`` (operator intervention: shutdown, admin disconnect), ``58`` (system error)
  and ``25006`` (read-only transaction: a failover) are transient; ``22`` (data exception)
  and ``23`` (integrity constraint) are the entry's; any other SQLSTATE is judged by the
  exception's class, as below (an ``OperationalError`` is transient).
- SQLite (no SQLSTATE): ``IntegrityError`` and ``DataError`` are the entry's; an
  ``OperationalError`` (a locked or read-only database, a disk I/O error, a file that
  cannot be opened) is transient.
- ``OSError`` anywhere (a refused or lost connection, a timeout, a full disk) is transient;
  so are SQLAlchemy's ``OperationalError`` and ``InterfaceError``, an invalidated
  connection, and an HTTP client's network errors, by the names of the exception's classes
  (no import): aiohttp's ``ClientError`` and ``ServerDisconnectedError``, Twisted's
  ``ConnectionRefusedError``, ``ConnectionLost``, ``ConnectionDone`` and
  ``ResponseNeverReceived``, urllib3's ``MaxRetryError`` and ``ProtocolError``.
- A text that cannot be encoded (``UnicodeError``, ``ValueError`` from a JSON encoder) is
  the entry's.
- Anything else (a pipeline's own exception) is unknown: it counts against the entry, as
  the entry's does, but only with proof that the sink works (:mod:`.isolate`).
"""

from __future__ import annotations

import enum

__all__ = ["Fault", "classify"]

#: SQLSTATE classes (first two characters) of an error the database will get over.
TRANSIENT_CLASSES = frozenset({"08", "40", "53", "55", "57", "58"})
#: Full SQLSTATEs of an error the database will get over: a read-only transaction (a
#: replica promoted, a failover under way).
TRANSIENT_STATES = frozenset({"25006"})
#: SQLSTATE classes of an error the entry itself causes: data exception, integrity
#: constraint violation.
ENTRY_CLASSES = frozenset({"22", "23"})
#: Exception class names (DB-API, SQLAlchemy, redis-py: not all of them are OSErrors) that say
#: the backend is unreachable or unusable for now, whatever the driver.
TRANSIENT_NAMES = frozenset(
    {
        "OperationalError",
        "InterfaceError",
        "DisconnectionError",
        "ConnectionError",
        "TimeoutError",
        "OSError",
        # HTTP clients a pipeline may post with (by name: none of them is imported here)
        "ClientError",  # aiohttp (ServerDisconnectedError, ClientConnectorError...)
        "ServerDisconnectedError",
        "ConnectionRefusedError",  # twisted.internet.error (not an OSError)
        "ConnectionLost",
        "ConnectionDone",
        "ResponseNeverReceived",  # twisted.web._newclient
        "MaxRetryError",  # urllib3
        "ProtocolError",
    }
)
#: Exception class names (DB-API) that say the row is refused.
ENTRY_NAMES = frozenset({"IntegrityError", "DataError"})


class Fault(enum.Enum):
    """Whose fault a failure is."""

    TRANSIENT = "transient"  #: the sink's, for now: never counts against an entry
    ENTRY = "entry"  #: the entry's: a value or a constraint the sink refuses
    UNKNOWN = "unknown"  #: cannot say: counts against an entry only with proof


def _sqlstate(exc: BaseException) -> str | None:
    for err in (exc, getattr(exc, "orig", None)):
        state = getattr(err, "sqlstate", None) or getattr(err, "pgcode", None)
        if isinstance(state, str) and len(state) == 5:
            return state
    return None


def _by_sqlstate(state: str) -> Fault:
    if state in TRANSIENT_STATES or state[:2] in TRANSIENT_CLASSES:
        return Fault.TRANSIENT
    if state[:2] in ENTRY_CLASSES:
        return Fault.ENTRY
    return Fault.UNKNOWN


def _names(exc: BaseException) -> set[str]:
    orig = getattr(exc, "orig", None)
    classes = [*type(exc).__mro__, *(type(orig).__mro__ if orig is not None else ())]
    return {cls.__name__ for cls in classes}


def classify(exc: BaseException) -> Fault:
    """Whose fault *exc*, raised by a sink's write, is (see the module's rules)."""
    state = _sqlstate(exc)
    fault = _by_sqlstate(state) if state is not None else Fault.UNKNOWN
    if fault is not Fault.UNKNOWN:
        return fault
    if getattr(exc, "connection_invalidated", False):
        return Fault.TRANSIENT
    names = _names(exc)
    if names & ENTRY_NAMES:
        return Fault.ENTRY
    if names & TRANSIENT_NAMES or isinstance(exc, OSError):
        return Fault.TRANSIENT
    if isinstance(exc, UnicodeError):
        return Fault.ENTRY
    return Fault.UNKNOWN
