"""A Scrapy request to its stored document, every meta and cb_kwargs value tagged with its type.

Plain JSON values are stored as they are; bytes, tuples, sets, frozensets, dicts with
non-string keys, datetimes (naive and aware), dates, times, timedeltas, Decimals, UUIDs,
Enum members, items and nested requests become short one-key objects (``{"__b": ...}``).
What has no faithful form is refused with the URL, the path of the value and its type.
"""

from __future__ import annotations

import base64
import datetime
import enum
import json
import logging
import uuid
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from scrapy.http import Request

from scrapy_ha.codec import trust
from scrapy_ha.codec.credentials import clean_headers, clean_meta
from scrapy_ha.codec.document import (
    BYTES_TAG,
    CALLBACKS,
    CLASS,
    DICT_TAG,
    EXTRA,
    FIELDS,
    FORMAT_VERSION,
    HEADERS,
    KNOWN_ATTRIBUTES,
    MAX_DEPTH,
    MAX_PAYLOAD_BYTES,
    REQUEST_TAG,
    STORABLE,
    URL,
    VERSION,
    CodecError,
    Unstorable,
    overnested,
    oversize,
    type_name,
)
from scrapy_ha.codec.flat import flat_payload

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from scrapy import Spider

#: The public module's name: users filter the codec's warnings by it.
logger = logging.getLogger("scrapy_ha.codec")

#: The fields ``"drop-key"`` may leave keys out of (the others are the request itself).
_DROPPABLE = ("meta", "cb_kwargs")
_PLAIN = frozenset((str, int, float, bool, type(None)))
#: JSON's own scalar types, bool first (it is an int): a subclass is stored as its base.
_JSON_SCALARS: tuple[type, ...] = (bool, int, float, str)
#: Containers whose subclasses (OrderedDict, a list subclass...) are stored as the base type.
_CONTAINERS: frozenset[type] = frozenset((list, dict, tuple, set, frozenset))
#: (field, key, type) already warned about under ``"drop-key"``: one WARNING each per process.
_DROPPED_WARNED: set[tuple[str, str, str]] = set()


#: The stored JSON's form, built once: ``json.dumps(doc, separators=(",", ":"),
#: ensure_ascii=False)`` builds its encoder again for every request. No check for reference
#: cycles: a document is built afresh by :func:`tag`, which fails on a cycle first (a
#: RecursionError).
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, check_circular=False)


def _one_shot() -> Callable[[Any, int], Sequence[str]] | None:
    """``_ENCODER``'s C accelerator, called directly: the chunks of a document, which
    ``_ENCODER.encode`` would join after two calls more (None: no accelerator)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    basestring = json.encoder.encode_basestring
    encoder: Callable[[Any, int], Sequence[str]] = make(
        None, _ENCODER.default, basestring, None, ":", ",", False, False, True
    )
    return encoder


_ONE_SHOT = _one_shot()


def stored_bytes(doc: Any) -> bytes:
    """*doc* as stored (a request's, an item's): compact JSON in UTF-8, where a lone
    surrogate, which UTF-8 cannot hold, is written as a JSON escape."""
    try:
        if _ONE_SHOT is not None:
            return "".join(_ONE_SHOT(doc, 0)).encode()
        return _ENCODER.encode(doc).encode()
    except UnicodeEncodeError:
        return json.dumps(doc, separators=(",", ":")).encode()


def encode_request(request: Request, spider: Spider | None, *, unstorable: str = "error") -> bytes:
    """Serialize *request*; raise :class:`CodecError` naming the URL, the field and the type.

    With ``unstorable="drop-key"`` a ``meta`` or ``cb_kwargs`` key whose value cannot be
    stored is left out instead (a WARNING once per key and type).
    """
    payload = flat_payload(request, spider)  # most requests: written directly
    flat = payload is not None  # then nested FLAT_DEPTH levels at most, far below MAX_DEPTH
    if payload is None:
        doc = {VERSION: FORMAT_VERSION, **_encode_doc(request, spider, unstorable)}
        payload = stored_bytes(doc)
    # the usual request is small and flat: both checks below pass (calls saved per request)
    small = len(payload) <= MAX_PAYLOAD_BYTES
    if small and (flat or payload.count(b"[") + payload.count(b"{") <= MAX_DEPTH):
        return payload
    too_much = oversize(payload) or overnested(payload)
    if too_much:  # no worker would read it back: refused here, loudly, not dead-lettered there
        raise CodecError(
            f"cannot store the request for {request.url}: {too_much}; keep large or deeply "
            f"nested data out of meta and cb_kwargs (store it elsewhere, pass its key)"
        )
    return payload


def _encode_doc(request: Request, spider: Spider | None, unstorable: str) -> dict[str, Any]:
    doc: dict[str, Any] = {URL: request.url}
    _put_callbacks(doc, request, spider)
    headers = clean_headers(request, spider)
    if headers:
        doc[HEADERS] = _tag_field(request, "headers", headers, spider, "error")
    for attr, key, default in FIELDS:
        value = getattr(request, attr)
        if attr == "meta":
            value = clean_meta(request, value, spider)
        if value != default:
            doc[key] = _tag_field(request, attr.lstrip("_"), value, spider, unstorable)
    cls = type(request)
    if cls is not Request:
        doc[CLASS] = trust.class_name(cls, request.url)
        for name in cls.attributes:
            if name not in KNOWN_ATTRIBUTES:
                value = getattr(request, name)
                field = f"{cls.__name__}.{name}"  # named as an attribute, not a meta key
                doc.setdefault(EXTRA, {})[name] = _tag_field(request, field, value, spider, "error")
    return doc


def _put_callbacks(doc: dict[str, Any], request: Request, spider: Spider | None) -> None:
    for attr, key in CALLBACKS:
        func = getattr(request, attr)
        if func is None:
            continue
        if isinstance(func, str):
            doc[key] = func
            continue
        doc[key] = trust.callback_name(spider, func, request.url, attr)


def _tag_field(
    request: Request, field: str, value: Any, spider: Spider | None, unstorable: str
) -> Any:
    try:
        try:
            return tag(value, spider)
        except (Unstorable, RecursionError):
            if unstorable != "drop-key" or field not in _DROPPABLE:
                raise
            return tag(_without_unstorable(request, field, value, spider), spider)
    except Unstorable as exc:
        raise CodecError(_unstorable_message(request.url, field, exc)) from None
    except RecursionError:
        raise CodecError(_recursive_message(request.url, field, value, spider)) from None


def _recursive_message(url: str, field: str, value: Any, spider: Spider | None) -> str:
    """Names the meta/cb_kwargs key that holds the value (which ``"drop-key"`` leaves out)."""
    where, other_way = field, ""
    if field in _DROPPABLE:
        other_way = "; or set HA_UNSTORABLE = 'drop-key' to leave such meta/cb_kwargs keys out"
        for key, item in value.items():
            try:
                tag(item, spider)
            except RecursionError:
                where = f"{field}[{key!r}]"
                break
            except Unstorable:
                continue
    return (
        f"cannot store the request for {url}: its {where} is nested too deeply (or refers "
        f"to itself); store a flat copy of the data{other_way}"
    )


def _unstorable_message(url: str, field: str, exc: Unstorable) -> str:
    """Raised for meta and cb_kwargs only under ``"error"`` (``"drop-key"`` leaves the key
    out): there, and only there, the setting is the other way out."""
    other_way = (
        "; or set HA_UNSTORABLE = 'drop-key' to leave such meta/cb_kwargs keys out"
        if field in _DROPPABLE
        else ""
    )
    return (
        f"cannot store the request for {url}: {field}{exc.where()} is of type {exc.kind}, "
        f"which scrapy-ha cannot store ({exc.why}). Store one of: {STORABLE}{other_way}"
    )


def _without_unstorable(
    request: Request, field: str, value: dict[Any, Any], spider: Spider | None
) -> dict[Any, Any]:
    """*value* without the keys whose values cannot be stored (a WARNING once per key)."""
    kept = {}
    for k, v in value.items():
        try:
            tag(v, spider)
        except (Unstorable, RecursionError) as exc:
            kind = exc.kind if isinstance(exc, Unstorable) else "recursive"
            if (field, repr(k), kind) not in _DROPPED_WARNED:
                _DROPPED_WARNED.add((field, repr(k), kind))
                logger.warning(
                    "The request for %s is stored without %s[%r]: a value of type %s cannot "
                    "be stored (HA_UNSTORABLE = 'drop-key'; this is logged once per key)",
                    request.url,
                    field,
                    k,
                    kind,
                )
            continue
        kept[k] = v
    return kept


# --------------------------------------------------------------------------- values


def tag(value: Any, spider: Spider | None) -> Any:
    """*value* as JSON data; raise :class:`Unstorable` for what has no faithful form."""
    cls = type(value)
    if cls in _PLAIN:
        return value
    encoder = _ENCODERS.get(cls)
    if encoder is not None:
        return encoder(value, spider)
    return _tag_other(value, spider)


def _tag_list(values: Any, spider: Spider | None) -> list[Any]:
    out = []
    for i, v in enumerate(values):
        try:
            out.append(tag(v, spider))
        except Unstorable as exc:
            exc.path.append(f"[{i}]")
            raise
    return out


def _tag_dict(value: dict[Any, Any], spider: Spider | None) -> Any:
    try:
        if all(type(k) is str and k[:2] != "__" for k in value):
            return {k: tag(v, spider) for k, v in value.items()}
        return {DICT_TAG: [[tag(k, spider), tag(v, spider)] for k, v in value.items()]}
    except Unstorable as exc:
        exc.path.append(_failing_key(value, spider))
        raise


def _failing_key(value: dict[Any, Any], spider: Spider | None) -> str:
    """The ``[key]`` of *value* whose key or value cannot be stored (for the error's path)."""
    for k, v in value.items():
        for part in (k, v):
            try:
                tag(part, spider)
            except Unstorable:
                return f"[{k!r}]"
    return "[?]"  # pragma: no cover - called only after a failure


def _tag_datetime(value: datetime.datetime, spider: Spider | None) -> Any:
    zone = getattr(value.tzinfo, "key", None)
    if zone is not None and type(value.tzinfo).__name__ == "ZoneInfo":
        # the wall time, the zone and the fold: exact even in a DST gap or overlap
        wall = value.replace(tzinfo=None, fold=0).isoformat()
        return {"__dt": [wall, zone, 1] if value.fold else [wall, zone]}
    if value.fold:  # the later of two equal wall times (isoformat does not say)
        return {"__dt": [value.replace(fold=0).isoformat(), None, 1]}
    return {"__dt": value.isoformat()}


def _tag_time(value: datetime.time, spider: Spider | None) -> Any:
    if value.fold:
        return {"__tm": [value.replace(fold=0).isoformat(), 1]}
    return {"__tm": value.isoformat()}


_ENCODERS: dict[type, Callable[[Any, Spider | None], Any]] = {
    list: _tag_list,
    dict: _tag_dict,
    tuple: lambda v, s: {"__t": _tag_list(v, s)},
    bytes: lambda v, s: {BYTES_TAG: base64.b64encode(v).decode()},
    set: lambda v, s: {"__s": _tag_list(v, s)},
    frozenset: lambda v, s: {"__fs": _tag_list(v, s)},
    datetime.datetime: _tag_datetime,
    datetime.date: lambda v, s: {"__da": v.isoformat()},
    datetime.time: _tag_time,
    datetime.timedelta: lambda v, s: {"__td": [v.days, v.seconds, v.microseconds]},
    Decimal: lambda v, s: {"__dc": str(v)},
    uuid.UUID: lambda v, s: {"__u": v.hex},
}


def _tag_other(value: Any, spider: Spider | None) -> Any:
    """Subclasses and classes named in the payload (Enums, items, requests)."""
    if isinstance(value, enum.Enum):
        return _tag_enum(value, spider)
    if isinstance(value, Request):
        return {REQUEST_TAG: _encode_nested(value, spider)}
    kind = trust.item_kind(type(value))
    if kind is not None:
        name = trust.class_name(type(value), None)
        return {"__i": [name, _tag_dict(trust.item_fields(value, kind), spider)]}
    return _tag_subclass(value, spider)


def _tag_subclass(value: Any, spider: Spider | None) -> Any:
    """A subclass of a JSON type (not an Enum) or of a tagged type (OrderedDict...)."""
    for json_type in _JSON_SCALARS:
        if isinstance(value, json_type):
            return json_type(value)
    for base, encoder in _ENCODERS.items():
        if isinstance(value, base):
            return encoder(base(value) if base in _CONTAINERS else value, spider)
    raise Unstorable(type_name(type(value)), "not a data type scrapy-ha knows how to rebuild")


def _tag_enum(member: enum.Enum, spider: Spider | None) -> Any:
    cls = type(member)
    name = trust.class_name(cls, None)
    if member.name is not None and cls._member_map_.get(member.name) is member:
        return {"__e": [name, member.name]}
    return {"__e": [name, None, tag(member.value, spider)]}  # a combination of Flag members


def _encode_nested(request: Request, spider: Spider | None) -> dict[str, Any]:
    try:
        return _encode_doc(request, spider, "error")
    except CodecError as exc:
        raise Unstorable(type_name(type(request)), str(exc)) from None
