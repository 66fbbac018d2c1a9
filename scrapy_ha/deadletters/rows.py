"""The archive table's row of one dead letter (:mod:`scrapy_ha.deadletters.archive`), built
from whatever the record holds: a field the record holds as garbage (a time past the year
9999, attempts that are not a number, a class longer than its column) falls back on what is
known (the dead-letter time, NULL, 0, a cut), and a record that cannot be read at all still
gives a row that says so. One bad record never costs the rest of its batch their copy."""

from __future__ import annotations

__all__ = ["row"]

import json
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from scrapy_ha.codec.masking import json_safe, mask_text, mask_url, mask_value
from scrapy_ha.codec.summary import mask_payload

if TYPE_CHECKING:
    from scrapy_ha.deadletters.dlq import DeadEntry

logger = logging.getLogger(__name__)

#: Lengths of the table's string columns (archive._table): a longer value is cut to fit.
METHOD_LENGTH, CLASS_LENGTH, ID_LENGTH = 16, 64, 64
#: An SQL INTEGER (PostgreSQL's is 32 bits): attempts and status outside it are garbage.
INTEGER_MAX = 2**31 - 1
#: What converting a stored time can raise on garbage (NaN, inf, a year past 9999).
_BAD_TIME = (TypeError, ValueError, OverflowError, OSError)


def row(spider: str, entry: DeadEntry, now: datetime) -> dict[str, Any]:
    """The table row of one dead letter, masked as every display masks it; never raises."""
    try:
        return _row(spider, entry, now)
    except Exception as exc:  # noqa: BLE001 - a record nothing could read still gets a row
        logger.warning("Dead letter %s of %s: record unreadable: %r", entry.id, spider, exc)
        return _unreadable(spider, entry, now, exc)


def _row(spider: str, entry: DeadEntry, now: datetime) -> dict[str, Any]:
    info = entry.info
    dead_at = _time(entry.dead_at, now)
    history = info.get("history")
    return {
        "spider": spider,
        "entry_id": str(entry.id)[:ID_LENGTH],
        "url": _text(mask_url(str(entry.url))),
        "method": _text(str(entry.summary.method or "GET"))[:METHOD_LENGTH],
        "failure_class": _text(str(entry.failure_class))[:CLASS_LENGTH],
        "reason": _text(mask_text(str(entry.reason))),
        "status": _integer(info.get("status")),
        "attempts": _attempts(entry),
        "history": json_safe(mask_value(history)) if isinstance(history, list) else [],
        "first_failure": _time(info.get("first"), dead_at),
        "last_failure": _time(info.get("last"), dead_at),
        "payload": _payload(entry),
        "archived_at": now,
    }


def _unreadable(spider: str, entry: DeadEntry, now: datetime, error: Exception) -> dict[str, Any]:
    when = _time(getattr(entry, "dead_at", None), now)
    return {
        "spider": spider,
        "entry_id": str(entry.id)[:ID_LENGTH],
        "url": "",
        "method": "GET",
        "failure_class": "unknown",
        "reason": _text(mask_text(f"record unreadable: {type(error).__name__}: {error}")),
        "status": None,
        "attempts": 0,
        "history": [],
        "first_failure": when,
        "last_failure": when,
        "payload": None,
        "archived_at": now,
    }


def _text(value: str) -> str:
    """*value* fit for a text column: NUL, which PostgreSQL refuses in text, written ``\\x00``."""
    return value.replace("\x00", "\\x00")


def _time(ms: Any, fallback: datetime) -> datetime:
    """The time *ms* (ms since the epoch), else *fallback* (None, garbage, out of range)."""
    if ms is None or isinstance(ms, bool):
        return fallback
    try:
        return datetime.fromtimestamp(float(ms) / 1000, UTC)
    except _BAD_TIME:
        return fallback


def _integer(value: Any) -> int | None:
    """*value* when it is an int an SQL INTEGER holds, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INTEGER_MAX:
        return value
    return None


def _attempts(entry: DeadEntry) -> int:
    try:
        attempts = entry.attempts
    except (TypeError, ValueError, OverflowError):
        return 0
    return _integer(attempts) or 0


def _payload(entry: DeadEntry) -> str | None:
    try:
        document = mask_payload(entry.summary.document)
        return json.dumps(json_safe(document), separators=(",", ":")) if document else None
    except (TypeError, ValueError, RecursionError):
        return None
