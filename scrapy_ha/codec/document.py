"""The stored document: ``{"v": 1, "u": url, ...}``, with short field names.

Only fields that differ from Scrapy's defaults are present, so a plain request stays small.
Values that plain JSON cannot hold are tagged with one-key objects (``{"__b": ...}``); the
tags are written by :mod:`.encode` and read by :mod:`.decode`.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from itertools import accumulate
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

#: The types JSON reads and writes as themselves: a stored value of one of them is
#: neither tagged nor untagged.
PLAIN_TYPES = frozenset((str, int, float, bool, type(None)))
#: The header whose values a crawl's requests share most (a page's links): the codec
#: remembers the stored form of its values, as of header names, and of no other value.
REFERER = b"Referer"
#: The tag of bytes (base64 text).
BYTES_TAG = "__b"


def remember(cache: dict[Any, Any], key: Any, value: Any, limit: int) -> None:
    """Keep *key* -> *value* in *cache*, a memo of the stored form of header names and
    Referers (the writer's and the reader's), emptied first when it holds *limit* entries:
    a crawl of more forgets them all and makes them again."""
    if len(cache) >= limit:
        cache.clear()
    cache[key] = value


#: The tag of a dict whose keys are not all plain strings (a list of ``[key, value]`` pairs).
DICT_TAG = "__d"
#: The tag of a Request nested in a value (its own document).
REQUEST_TAG = "__r"

#: The setting listing the URL schemes a request read from Redis may have.
ALLOWED_SCHEMES_SETTING = "HA_ALLOWED_SCHEMES"
#: The web's schemes. Scrapy also fetches ``file``, ``data``, ``ftp`` and ``s3`` URLs: a
#: stored ``file:///proc/self/environ`` would hand a worker's environment (``REDIS_URL``
#: and its password among it) to a callback, and from there to the items. Whoever can
#: write to Redis must not choose what a worker reads on its own machine or with its
#: credentials.
DEFAULT_ALLOWED_SCHEMES = frozenset(("http", "https"))
#: Setting listing more classes a payload may name (``module:Qualname`` or ``module.Class``).
CODEC_CLASSES_SETTING = "HA_CODEC_CLASSES"
#: What to do with a meta or cb_kwargs value that cannot be stored (``HA_UNSTORABLE``):
#: ``"error"`` raises :class:`CodecError`; ``"drop-key"`` stores the request without that key.
UNSTORABLE_POLICIES = ("error", "drop-key")

# -- limits: what one payload may cost the reactor thread that decodes it ----------------

#: Largest payload a worker stores or reads, in bytes. A plain request takes about 100
#: bytes and a page's HTML passed in meta a few hundred KB (its bytes a third more in
#: base64); parsing 16 MB of small JSON objects took the reactor thread 2.3 s on a busy
#: 2-core machine, so 8 MiB bounds one entry at about a second.
MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
#: Deepest nesting of a payload's JSON, the document itself counting one and each tagged
#: container two (``{"__t": [...]}``). Real meta is a few levels deep; 100 keeps every
#: recursive walk of the value (the decoder, the encoder on a retry, ``copy.deepcopy``,
#: ``pprint``) far from Python's recursion limit of 1000, where it would fail half-way.
MAX_DEPTH = 100
#: Most values of one set, frozenset or tagged dict's keys that may share a hash. Python
#: compares a new element with every element of its hash already there, so k of them cost
#: k * k / 2 comparisons, and int hashes are not randomised (every multiple of 2**61 - 1
#: hashes to 0): 16,000 such ints (395 KB) took 5.3 s to decode, 32,000 (795 KB) 26 s, so
#: a payload within the size limit would hold the reactor thread for about 48 minutes.
#: Distinct values of real data share a hash only by accident (-1 and -2 do); 8 keeps the
#: cost to a few comparisons per element.
MAX_SHARED_HASH = 8

#: What a stored value may be, for error messages.
STORABLE = (
    "str, numbers, bool, None, bytes, lists, tuples, sets, dicts, datetime/date/time/"
    "timedelta, Decimal, UUID, Enum members, items (scrapy.Item, dataclass, attrs, pydantic) "
    "and Requests"
)


class CodecError(ValueError):
    """A request cannot be serialized, or a payload cannot be read back."""


class Refused(CodecError):
    """A well-formed payload of a request this worker does not fetch from Redis (a scheme
    outside ``HA_ALLOWED_SCHEMES``): the scheduler dead-letters it as ``refused``."""


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


def oversize(payload: bytes | str) -> str | None:
    """Why *payload* is too large to store or read (None if it is not)."""
    if len(payload) <= MAX_PAYLOAD_BYTES:
        return None
    return (
        f"its payload is {len(payload):,} bytes, more than the {MAX_PAYLOAD_BYTES:,} a worker "
        f"reads (scrapy-ha's MAX_PAYLOAD_BYTES)"
    )


#: A JSON string, escapes included (unrolled: linear, no backtracking).
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
#: Every byte but the brackets, deleted to leave a document's structure.
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
#: How each bracket moves the nesting level.
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def overnested(payload: bytes | str) -> str | None:
    """Why *payload*, valid JSON, is nested too deeply (None if it is not).

    Nesting cannot exceed the number of ``[`` and ``{``: counting them is the fast path
    (a request holds a few). Past ``MAX_DEPTH`` of them, the brackets outside strings are
    summed up at C speed (0.3 s for 8.7 MB of small objects; walking the parsed document
    in Python took twice as long or more).
    """
    data = payload.encode("utf-8", "surrogatepass") if isinstance(payload, str) else payload
    if data.count(b"[") + data.count(b"{") <= MAX_DEPTH:
        return None
    brackets = _JSON_STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    if max(accumulate(map(_STEP.__getitem__, brackets)), default=0) <= MAX_DEPTH:
        return None
    return f"its payload is nested more than {MAX_DEPTH} levels deep (MAX_DEPTH)"


def read_document(payload: bytes | str, what: str) -> Any:
    """The JSON document of a stored *what* (``"request"``, ``"item"``), checked before
    anything is built from it: not too large to read, JSON, not nested too deeply; raise
    :class:`CodecError` naming *what* otherwise."""
    too_large = oversize(payload)
    if too_large:
        raise CodecError(f"the {what} cannot be read: {too_large}")
    try:
        doc = json.loads(payload)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise CodecError(f"the {what} is not JSON: {exc}") from None
    too_deep = overnested(payload)
    if too_deep:
        raise CodecError(f"the {what} cannot be read: {too_deep}")
    return doc


def colliding(values: list[Any], what: str) -> str | None:
    """Why building a set or dict from *values* would be a hash flood (None if not)."""
    if len(values) <= MAX_SHARED_HASH:
        return None
    counts = Counter(map(hash, values))
    shared, n = counts.most_common(1)[0]
    if n <= MAX_SHARED_HASH:
        return None
    return (
        f"a stored {what} holds {n} values that share the hash {shared}, more than "
        f"{MAX_SHARED_HASH} (MAX_SHARED_HASH): a payload built to make decoding slow"
    )


def setting_names(value: Any) -> tuple[Any, ...]:
    """The entries of a setting that lists names (``HA_CODEC_CLASSES``, and the other list
    settings, :func:`scrapy_ha.config.validate.names`): a list, tuple or set as it is, or
    text from the command line (``-s``, scrapyd): a JSON list, or names separated by
    commas (blanks around each dropped). Raise ValueError, saying what it must be, for
    anything else (a number, a dict: Scrapy's ``getlist`` took a dict's keys, and raised
    a TypeError from a number wherever the setting was read)."""
    if value is None:
        return ()
    if isinstance(value, (list, tuple, set, frozenset)):
        return tuple(value)
    if not isinstance(value, str):
        raise ValueError("must be a list (or its text: a JSON list, or names and commas)")
    if value.lstrip().startswith("["):
        try:
            found = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"is no JSON list ({exc})") from None
        if not isinstance(found, list):
            raise ValueError("must be a JSON list")
        return tuple(found)
    return tuple(part.strip() for part in value.split(",") if part.strip())
