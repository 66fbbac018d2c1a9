"""The stored document: ``{"v": 1, "u": url, ...}``, with short field names.

Only fields that differ from Scrapy's defaults are present, so a plain request stays small.
Values that plain JSON cannot hold are tagged with one-key objects (``{"__b": ...}``); the
tags are written by :mod:`.encode` and read by :mod:`.decode`.
"""

from __future__ import annotations

from typing import Any

#: Version of the payload format; a payload with another version is refused. New tags were
#: added without a new version: every payload of an older scrapy-ha still reads the same.
FORMAT_VERSION = 1

# Short field names keep every queued request small in Redis memory.
VERSION = "v"
URL = "u"
CALLBACK = "cb"
ERRBACK = "eb"
HEADERS = "h"
METHOD = "m"
BODY = "b"
META = "mt"
PRIORITY = "p"
#: The import name of a Request subclass (absent for a plain ``Request``).
CLASS = "cls"
#: A Request subclass's own attributes (``JsonRequest.dumps_kwargs``...).
EXTRA = "x"

#: (request attribute, document key, Scrapy's default) of the fields stored when not default.
FIELDS: tuple[tuple[str, str, Any], ...] = (
    ("method", METHOD, "GET"),
    ("body", BODY, b""),
    ("cookies", "c", {}),
    ("meta", META, {}),
    ("_encoding", "e", "utf-8"),
    ("priority", PRIORITY, 0),
    ("dont_filter", "df", False),
    ("flags", "f", []),
    ("cb_kwargs", "k", {}),
)
#: (request attribute, document key) of the callbacks, stored by the spider method's name.
CALLBACKS = (("callback", CALLBACK), ("errback", ERRBACK))
#: The types a stored field may have where Scrapy's default does not say it.
FIELD_TYPES: dict[str, type | tuple[type, ...]] = {"c": (dict, list), PRIORITY: int}
#: The Request attributes the fields above store; a subclass's others go to ``EXTRA``.
KNOWN_ATTRIBUTES = frozenset(
    (
        "url",
        "callback",
        "errback",
        "headers",
        "method",
        "body",
        "cookies",
        "meta",
        "encoding",
        "priority",
        "dont_filter",
        "flags",
        "cb_kwargs",
    )
)

#: The tag of bytes (base64 text).
BYTES_TAG = "__b"
#: The tag of a dict whose keys are not all plain strings (a list of ``[key, value]`` pairs).
DICT_TAG = "__d"
#: The tag of a Request nested in a value (its own document).
REQUEST_TAG = "__r"

#: What a stored value may be, for error messages.
STORABLE = (
    "str, numbers, bool, None, bytes, lists, tuples, sets, dicts, datetime/date/time/"
    "timedelta, Decimal, UUID, Enum members, items (scrapy.Item, dataclass, attrs, pydantic) "
    "and Requests"
)


class CodecError(ValueError):
    """A request cannot be serialized, or a payload cannot be read back."""


class Unstorable(Exception):
    """A value that cannot be stored; ``path`` is filled in (innermost first) on the way out."""

    def __init__(self, kind: str, why: str) -> None:
        super().__init__(kind)
        self.kind = kind
        self.why = why
        self.path: list[str] = []

    def where(self) -> str:
        return "".join(reversed(self.path))


def type_name(cls: type) -> str:
    """``module.Qualname`` of *cls*, for messages."""
    return f"{cls.__module__}.{cls.__qualname__}"
