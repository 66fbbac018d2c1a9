"""A stored document back to a Scrapy request, building only what :mod:`.trust` allows.

Every malformed payload raises :class:`CodecError`, whatever is wrong with it: the
scheduler dead-letters such an entry as corrupt. So does a payload that would cost the
reactor thread more than its share: larger than ``MAX_PAYLOAD_BYTES``, nested deeper than
``MAX_DEPTH``, or a set or dict whose values were chosen to share a hash (more than
``MAX_SHARED_HASH`` of them), which would take minutes to build.
"""

from __future__ import annotations

import base64
import datetime
import enum
import sys
import uuid
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from scrapy.http import Request
from scrapy.utils.httpobj import urlparse_cached

from scrapy_ha.codec import trust
from scrapy_ha.codec.document import (
    ALLOWED_SCHEMES_SETTING,
    BYTES_TAG,
    CALLBACKS,
    CLASS,
    DEFAULT_ALLOWED_SCHEMES,
    DICT_TAG,
    EXTRA,
    FIELD_TYPES,
    FIELDS,
    FORMAT_VERSION,
    HEADERS,
    KNOWN_ATTRIBUTES,
    MAX_SHARED_HASH,
    PLAIN_TYPES,
    REFERER,
    REQUEST_TAG,
    URL,
    VERSION,
    CodecError,
    Refused,
    colliding,
    read_document,
    remember,
    type_name,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    from scrapy import Spider


def decode_request(
    payload: bytes | str,
    spider: Spider | None,
    *,
    schemes: Collection[str] = DEFAULT_ALLOWED_SCHEMES,
) -> Request:
    """Rebuild a request from :func:`encode_request` output; raise :class:`CodecError`.

    Every malformed payload raises :class:`CodecError`, whatever is wrong with it; a
    request whose URL scheme is not one of *schemes* (``HA_ALLOWED_SCHEMES``) raises
    :class:`Refused`. (A request nested in a value is checked when the spider yields it:
    the scheduler refuses it then.)
    """
    doc = read_document(payload, "request")
    if not isinstance(doc, dict) or doc.get(VERSION) != FORMAT_VERSION or URL not in doc:
        raise CodecError(f"payload is not a scrapy-ha request of format {FORMAT_VERSION}")
    request = _decode_doc(doc, spider)
    refusal = refused_scheme(request, schemes)
    if refusal:
        raise Refused(f"{refusal}: workers fetch no other scheme from Redis")
    return request


def refused_scheme(request: Request, schemes: Collection[str]) -> str | None:
    """Why *request* may not be fetched from Redis (None if its scheme is allowed): the
    scheme Scrapy's download handlers would pick, read from the URL as they read it."""
    url = request.url
    head = url[: max(0, url.find(":"))]
    if head in schemes and head.isalnum() and head.islower() and head[0].isalpha():
        # what urlsplit reads as the scheme of such a URL (an allowed scheme is the usual
        # case): the URL is parsed by whoever needs its other parts
        return None
    scheme = urlparse_cached(request).scheme
    if scheme in schemes:
        return None
    return (
        f"the request for {request.url} has the scheme {scheme!r}, which "
        f"{ALLOWED_SCHEMES_SETTING} ({', '.join(sorted(schemes))}) does not allow (add "
        f"{scheme!r} to it if the spider crawls {scheme}: URLs on purpose)"
    )


def _decode_doc(doc: Any, spider: Spider | None) -> Request:
    url = doc.get(URL) if isinstance(doc, dict) else None
    if not isinstance(url, str):
        raise CodecError("a stored request has no URL")
    try:
        cls, kwargs = _request_kwargs(doc, spider)
        return cls(**kwargs)
    except CodecError as exc:
        raise CodecError(f"cannot rebuild the request for {url}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - anything a malformed payload raises is corrupt data
        raise CodecError(
            f"cannot rebuild the request for {url}: {type(exc).__name__}: {exc}"
        ) from None


def _request_kwargs(
    doc: dict[str, Any], spider: Spider | None
) -> tuple[type[Request], dict[str, Any]]:
    cls = _request_class(doc[CLASS], spider) if CLASS in doc else Request
    kwargs: dict[str, Any] = {"url": doc[URL]}
    for attr, key, default in FIELDS:
        if key in doc:
            value = untag(doc[key], spider)
            if not isinstance(value, FIELD_TYPES.get(key, type(default))):
                raise CodecError(f"its {attr.lstrip('_')} is a {type(value).__name__}")
            kwargs[attr.lstrip("_")] = value
    if HEADERS in doc:
        kwargs["headers"] = _headers(doc[HEADERS], spider)
    kwargs.update(_extras(cls, doc.get(EXTRA, {}), spider))
    for attr, key in CALLBACKS:
        if key in doc:
            kwargs[attr] = trust.callback_method(spider, doc[key])
    return cls, kwargs


def _extras(cls: type[Request], extras: Any, spider: Spider | None) -> dict[str, Any]:
    """The stored attributes of a Request subclass, each one the class declares."""
    if not isinstance(extras, dict):
        raise CodecError("its extra attributes are not an object")
    for name in extras:
        if name in KNOWN_ATTRIBUTES or name not in cls.attributes:
            raise CodecError(f"{type_name(cls)} takes no attribute {name!r}")
    return {name: untag(value, spider) for name, value in extras.items()}


def _request_class(name: Any, spider: Spider | None) -> type[Request]:
    cls = trust.lookup(name) if isinstance(name, str) else None
    if not (isinstance(cls, type) and issubclass(cls, Request)):
        raise CodecError(f"the payload names {name!r} as its class, which is not a Request class")
    if not (cls.__module__.startswith("scrapy.") or trust.trusted(cls, spider)):
        raise trust.untrusted(name)
    return cls


# --------------------------------------------------------------------------- values


def untag(value: Any, spider: Spider | None) -> Any:
    """The value a tagged JSON value stands for; raise :class:`CodecError` if malformed."""
    cls = type(value)
    if cls is list:
        return [v if type(v) in PLAIN_TYPES else untag(v, spider) for v in value]
    if cls is not dict:
        return value
    if len(value) == 1:
        ((key, inner),) = value.items()
        if key[:2] == "__":
            decoder = _DECODERS.get(key)
            if decoder is None:
                raise CodecError(f"unknown tag {key!r}")
            return decoder(inner, spider)
    return {k: v if type(v) in PLAIN_TYPES else untag(v, spider) for k, v in value.items()}


#: Header names and Referer values read lately, by their stored (base64) text: a crawl's
#: requests share their few header names, and a page's links their Referer (as the
#: writer's ``flat._TAGGED``; no other value: a header a spider sets may hold a credential).
_UNTAGGED: dict[str, bytes] = {}
#: Most of them remembered, of up to 344 characters (256 bytes), as the writer's.
UNTAGGED_REMEMBERED = 1024
UNTAGGED_MAX_CHARS = 344


def _headers(value: Any, spider: Spider | None) -> Any:
    """:func:`untag` of a request's stored headers, read directly when they are what the
    writer writes (a tagged dict of a few byte-string names, each with a list of byte
    strings), header names and Referers remembered; anything else through :func:`untag`,
    which reads or refuses it as it does every value."""
    pairs = value.get(DICT_TAG) if type(value) is dict and len(value) == 1 else None
    if type(pairs) is not list or len(pairs) > MAX_SHARED_HASH:
        return untag(value, spider)
    headers = {}
    for pair in pairs:
        if type(pair) is not list or len(pair) != 2 or type(pair[1]) is not list:
            return untag(value, spider)
        name = _remembered(pair[0])
        if name is None:
            return untag(value, spider)
        read = _remembered if name == REFERER else _bytes_tag
        values = []
        for tagged in pair[1]:  # one at a time: the first value it cannot read is untag's
            data = read(tagged)
            if data is None:
                return untag(value, spider)
            values.append(data)
        headers[name] = values
    return headers


def _tag_text(value: Any) -> str | None:
    """The text of a ``{"__b": text}`` tag, or None for anything else."""
    text = value.get(BYTES_TAG) if type(value) is dict and len(value) == 1 else None
    return text if type(text) is str else None


def _bytes_tag(value: Any) -> bytes | None:
    """The bytes a ``{"__b": text}`` tag stands for, or None for anything else (invalid
    base64 raises, as :func:`untag` does)."""
    text = _tag_text(value)
    return None if text is None else base64.b64decode(text, validate=True)


def _remembered(value: Any) -> bytes | None:
    """:func:`_bytes_tag`, remembered for the header names and Referers met again."""
    text = _tag_text(value)
    if text is None:
        return None
    data = _UNTAGGED.get(text)
    if data is None:
        data = base64.b64decode(text, validate=True)
        if len(text) <= UNTAGGED_MAX_CHARS:
            remember(_UNTAGGED, text, data, UNTAGGED_REMEMBERED)
    return data


def _list(value: Any, spider: Spider | None) -> list[Any]:
    if type(value) is not list:
        raise CodecError(f"a tagged value holds {type(value).__name__}, not a list")
    return [untag(v, spider) for v in value]


def _text(value: Any) -> str:
    if type(value) is not str:
        raise CodecError(f"a tagged value holds {type(value).__name__}, not a string")
    return value


def _distinct(values: list[Any], what: str) -> list[Any]:
    """*values*, to build a set or dict of: refused if built to collide."""
    flood = colliding(values, what)
    if flood:
        raise CodecError(flood)
    return values


def _pairs(value: Any, spider: Spider | None) -> dict[Any, Any]:
    pairs = _list(value, spider)
    for pair in pairs:
        if type(pair) is not list or len(pair) != 2:
            raise CodecError("a tagged dict holds something else than [key, value] pairs")
    _distinct([k for k, _ in pairs], "dict")
    return dict(pairs)


def _untag_datetime(value: Any, spider: Spider | None) -> datetime.datetime:
    if type(value) is list and len(value) == 3 and value[1] is None and value[2] == 1:
        return datetime.datetime.fromisoformat(_text(value[0])).replace(fold=1)
    if type(value) is list and len(value) in (2, 3):
        zoneinfo = sys.modules.get("zoneinfo")
        if zoneinfo is None:
            raise CodecError("the zoneinfo module is not imported in this worker")
        wall = datetime.datetime.fromisoformat(_text(value[0]))
        if wall.tzinfo is not None:
            raise CodecError("a stored wall time has an offset")
        fold = 1 if len(value) == 3 and value[2] == 1 else 0
        return wall.replace(tzinfo=zoneinfo.ZoneInfo(_text(value[1])), fold=fold)
    return datetime.datetime.fromisoformat(_text(value))


def _untag_time(value: Any, spider: Spider | None) -> datetime.time:
    if type(value) is list and len(value) == 2 and value[1] == 1:
        return datetime.time.fromisoformat(_text(value[0])).replace(fold=1)
    return datetime.time.fromisoformat(_text(value))


def _untag_enum(value: Any, spider: Spider | None) -> enum.Enum:
    if type(value) is not list or len(value) not in (2, 3):
        raise CodecError("a tagged Enum member is not [class, name] or [class, None, value]")
    cls = trust.lookup(_text(value[0]))
    if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
        raise CodecError(f"the payload names {value[0]!r} as an Enum, which it is not")
    if not trust.trusted(cls, spider):
        raise trust.untrusted(value[0])
    if len(value) == 2:
        return cls._member_map_[_text(value[1])]
    return cls(untag(value[2], spider))


def _untag_item(value: Any, spider: Spider | None) -> Any:
    if type(value) is not list or len(value) != 2:
        raise CodecError("a tagged item is not [class, fields]")
    cls = trust.lookup(_text(value[0]))
    kind = trust.item_kind(cls) if isinstance(cls, type) else None
    if kind is None:
        raise CodecError(f"the payload names {value[0]!r} as an item class, which it is not")
    if not trust.trusted(cls, spider):
        raise trust.untrusted(value[0])
    fields = untag(value[1], spider)
    if type(fields) is not dict or not all(type(k) is str for k in fields):
        raise CodecError(f"the fields of a stored {value[0]} are not a dict of names")
    return trust.build_item(cls, kind, fields)


def _timedelta_parts(value: Any) -> list[int]:
    if type(value) is not list or len(value) != 3 or any(type(p) is not int for p in value):
        raise CodecError("a tagged timedelta is not [days, seconds, microseconds]")
    return value


_DECODERS: dict[str, Callable[[Any, Spider | None], Any]] = {
    BYTES_TAG: lambda v, s: base64.b64decode(_text(v), validate=True),
    "__t": lambda v, s: tuple(_list(v, s)),
    DICT_TAG: _pairs,
    "__s": lambda v, s: set(_distinct(_list(v, s), "set")),
    "__fs": lambda v, s: frozenset(_distinct(_list(v, s), "frozenset")),
    "__dt": _untag_datetime,
    "__da": lambda v, s: datetime.date.fromisoformat(_text(v)),
    "__tm": _untag_time,
    "__td": lambda v, s: datetime.timedelta(*_timedelta_parts(v)),
    "__dc": lambda v, s: Decimal(_text(v)),
    "__u": lambda v, s: uuid.UUID(hex=_text(v)),
    "__e": _untag_enum,
    "__i": _untag_item,
    REQUEST_TAG: _decode_doc,
}
