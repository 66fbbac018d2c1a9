"""Items as the item stream stores them (``HA_ITEMS = "outbox"``): the codec's tagged JSON.

:func:`encode_item` keeps every type the codec keeps in ``meta``: item classes
(``scrapy.Item``, dataclasses, attrs, pydantic), datetimes, Decimals, bytes, sets...
:func:`decode_item` builds an item back in a process that trusts its class (the project's
own pipelines, run by a consumer of the stream: classes of the spider's package, and those
of ``HA_CODEC_CLASSES``); :func:`plain_item` reads it as plain JSON and builds no class at
all (the JSON Lines and SQL sinks): an item's fields, a datetime, date or time as ISO 8601
text, a Decimal or a UUID as text, a timedelta as seconds, bytes as base64 text, tuples
and sets as lists, an Enum member as its name, a request as its URL.
"""

from __future__ import annotations

import base64
import datetime
import json
import uuid
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from scrapy_ha.codec.decode import untag
from scrapy_ha.codec.document import (
    BYTES_TAG,
    DICT_TAG,
    REQUEST_TAG,
    URL,
    CodecError,
    Unstorable,
    overnested,
    oversize,
    read_document,
)
from scrapy_ha.codec.encode import stored_bytes, tag

if TYPE_CHECKING:
    from scrapy import Spider

__all__ = ["decode_item", "encode_item", "plain_item"]

#: Tags whose value holds a list of values (a tuple, a set, a frozenset): plain lists.
_LISTS = ("__t", "__s", "__fs")


def encode_item(item: Any, spider: Spider | None) -> bytes:
    """*item* as stored in the stream; raise :class:`CodecError` naming the field and the
    type of a value the codec cannot keep, or an item too large or too deep to read back."""
    try:
        doc = tag(item, spider)
    except Unstorable as exc:
        raise CodecError(f"cannot store the item: {exc}") from None
    data = stored_bytes(doc)
    too_much = oversize(data) or overnested(data)
    if too_much:
        raise CodecError(f"cannot store the item: {too_much}")
    return data


def decode_item(data: bytes | str, spider: Spider | None) -> Any:
    """The item :func:`encode_item` stored, its class built if *spider*'s process trusts
    it (see :mod:`scrapy_ha.codec.trust`); raise :class:`CodecError` otherwise."""
    return untag(read_document(data, "item"), spider)


def plain_item(data: bytes | str) -> Any:
    """The item :func:`encode_item` stored, as plain JSON data (no class is built)."""
    return _plain(read_document(data, "item"))


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((key, inner),) = value.items()
        if key[:2] == "__":
            return _plain_tagged(key, inner)
    return {k: _plain(v) for k, v in value.items()}


def _plain_tagged(key: str, inner: Any) -> Any:
    if key in _LISTS:
        return _plain(inner)
    if key == BYTES_TAG:
        return inner
    if key == DICT_TAG:
        pairs = inner if isinstance(inner, list) else []
        return {_key(p[0]): _plain(p[1]) for p in pairs if isinstance(p, list) and len(p) == 2}
    if key == "__i":  # [class, fields]: the fields
        return _plain(inner[1]) if isinstance(inner, list) and len(inner) == 2 else None
    if key == "__e":  # [class, name] or [class, None, value]: the name, else the value
        if not isinstance(inner, list) or len(inner) < 2:
            return None
        return inner[1] if inner[1] is not None else _plain(inner[2] if len(inner) > 2 else None)
    if key == REQUEST_TAG:
        return inner.get(URL) if isinstance(inner, dict) else None
    return _scalar(untag({key: inner}, None))  # no class: datetimes, Decimals, UUIDs...


def _key(value: Any) -> str:
    plain = _plain(value)
    return plain if isinstance(plain, str) else json.dumps(plain, separators=(",", ":"))


def _scalar(value: Any) -> Any:
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, (datetime.date, datetime.time)):  # datetime is a date
        return value.isoformat()
    if isinstance(value, (Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value
