"""A flat request's stored form, written without building its document.

Most requests a spider yields are flat: a plain ``scrapy.Request`` with a callback of the
spider, perhaps a Referer header, and meta and cb_kwargs of strings, numbers, booleans and
None under string keys (``depth``, a page number). :func:`flat_payload` writes their JSON
text directly, byte for byte what :mod:`.encode` stores (which builds a document field by
field, then walks it with the JSON encoder: 35,600 instructions for a ``Request(url)``,
docs/benchmarks.md), and reads the fields Scrapy makes on first read without making them.
Anything else is None, and :func:`.encode.encode_request` builds its document;
``tests/test_codec_flat.py`` compares the two on a corpus of requests.
"""

from __future__ import annotations

import math
from binascii import b2a_base64
from json.encoder import encode_basestring
from typing import TYPE_CHECKING, Any

from scrapy.http import Headers, Request

from scrapy_ha import metakeys
from scrapy_ha.codec import trust
from scrapy_ha.codec.credentials import SPECIAL_META, clean_headers, clean_meta
from scrapy_ha.codec.document import (
    BODY,
    BYTES_TAG,
    CALLBACKS,
    DICT_TAG,
    FIELDS,
    FORMAT_VERSION,
    HEADERS,
    META,
    METHOD,
    PLAIN_TYPES,
    PRIORITY,
    REFERER,
    URL,
    VERSION,
    remember,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from scrapy import Spider

#: What the stored JSON writes a string as (``ensure_ascii=False``, the encoder's own).
_string: Callable[[str], str] = encode_basestring
#: The fields Scrapy 2.19 makes on first read: each slot (``_headers``...) holds None until
#: then, which stands for the field's default. Where a Scrapy does not (a plain attribute),
#: the fields are read as they are.
_LAZY_FIELDS = ("headers", "cookies", "meta", "flags", "cb_kwargs")
_LAZY = all(
    isinstance(vars(Request).get(name), property) and f"_{name}" in Request.__slots__
    for name in _LAZY_FIELDS
)
#: How the JSON encoder writes the values it writes without a call.
_CONSTANTS: dict[Any, str] = {None: "null", True: "true", False: "false"}
_HEAD = f'{{"{VERSION}":{FORMAT_VERSION},"{URL}":'
#: How deep a flat payload is nested at most: the document, its headers' tagged dict, the
#: list of pairs, a pair, its list of values, a value's bytes tag. The encoder checks no
#: deeper (document.MAX_DEPTH is far above).
FLAT_DEPTH = 6
#: The document's key of each field, by the request's attribute.
_KEY = {attr: key for attr, key, _ in FIELDS}


def flat_payload(request: Request, spider: Spider | None) -> bytes | None:
    """*request* as :func:`~scrapy_ha.codec.encode_request` stores it, if it is flat
    (see the module docstring); else None. Never raises: whatever is not flat, or fails
    here, is left to the document's encoder, which raises what it raises."""
    if type(request) is not Request:
        return None
    try:
        text = _flat_text(request, spider)
        return None if text is None else text.encode()
    except Exception:  # noqa: BLE001 - unusual values go the general way, which decides
        return None  # (a string that UTF-8 cannot hold: the document's encoder escapes it)


def _flat_text(request: Request, spider: Spider | None) -> str | None:
    headers, cookies, meta, flags, cb_kwargs = _fields(request)
    if (cookies is not None and cookies != {}) or (flags is not None and flags != []):
        return None
    priority, dont_filter = request.priority, request.dont_filter
    if type(priority) is not int or type(dont_filter) is not bool:
        return None
    kept = _kept_meta(request, meta, spider)  # (raises _NotFlat)
    if cb_kwargs and not _plain(cb_kwargs):
        return None  # before the callbacks and headers are read: the encoder reads them too
    parts = [_HEAD, _string(request.url)]
    _callbacks(parts, request, spider)
    if headers and (stored := _stored_headers(request, spider, headers)):
        parts += (f',"{HEADERS}":', stored)
    if request.method != "GET":
        parts += (f',"{METHOD}":', _string(request.method))
    if body := request.body:
        parts += (f',"{BODY}":', _bytes(body))
    if kept:
        parts += (f',"{META}":', _flat_dict(kept))
    if request.encoding != "utf-8":
        parts += (f',"{_KEY["_encoding"]}":', _string(request.encoding))
    if priority:
        parts.append(f',"{PRIORITY}":{int.__repr__(priority)}')
    if dont_filter:
        parts.append(f',"{_KEY["dont_filter"]}":true')
    if cb_kwargs:
        parts += (f',"{_KEY["cb_kwargs"]}":', _flat_dict(cb_kwargs))
    parts.append("}")
    return "".join(parts)


def _kept_meta(
    request: Request, meta: dict[str, Any] | None, spider: Spider | None
) -> dict[str, Any] | None:
    """The meta as stored (``clean_meta``), if every value of it is plain; else raise
    :class:`_NotFlat` (before the callbacks and headers are read: the encoder reads them
    too). A page's child carries its page's lease (the add-on's ParentLeaseMiddleware), a
    tuple never stored, which must not make it look not flat; a value ``clean_meta`` keeps
    as it is (under any other key) is looked at first, so that a request that is not flat
    anyway is given up before its meta is cleaned twice."""
    if not meta:
        return None
    kept, special = {}, False
    for k, v in meta.items():
        if k in SPECIAL_META:
            special = True
        elif type(v) in PLAIN_TYPES:
            kept[k] = v
        else:
            raise _NotFlat
    if not special:
        return meta  # (clean_meta's answer then: the meta itself)
    if metakeys.STRIPPED.issuperset(k for k in meta if k in SPECIAL_META):
        return kept  # only keys clean_meta drops: what it keeps is the rest, in order
    kept = clean_meta(request, meta, spider)  # a proxy, a slot, a timeout: it looks closer
    if kept and not _plain(kept):
        raise _NotFlat
    return kept


def _callbacks(parts: list[str], request: Request, spider: Spider | None) -> None:
    """The callback's and the errback's names (see encode._put_callbacks)."""
    for attr, key in CALLBACKS:
        func = getattr(request, attr)
        if func is not None:
            name = (
                func
                if isinstance(func, str)
                else trust.callback_name(spider, func, request.url, attr)
            )
            parts += (f',"{key}":', _string(name))


def _fields(request: Request) -> tuple[Any, Any, Any, Any, Any]:
    """headers, cookies, meta, flags and cb_kwargs, None where Scrapy has not made one."""
    if _LAZY:
        return (
            request._headers,
            request._cookies,
            request._meta,
            request._flags,
            request._cb_kwargs,
        )
    return request.headers, request.cookies, request.meta, request.flags, request.cb_kwargs


def header_names(request: Request) -> tuple[bytes, ...]:
    """The names of *request*'s headers now (without making Scrapy 2.19's lazy ``Headers``
    of a request that has none)."""
    headers = request._headers if _LAZY else request.headers
    return tuple(headers) if headers else ()


def _plain(value: Any) -> bool:
    """Whether *value* is a dict of values of ``PLAIN_TYPES`` (its keys are checked as it
    is written)."""
    return type(value) is dict and all(type(v) in PLAIN_TYPES for v in value.values())


class _NotFlat(Exception):
    """A value the document's encoder writes otherwise than as plain JSON."""


def _flat_dict(value: Mapping[Any, Any]) -> str:
    """A dict of plain values under string keys, as the JSON encoder writes it."""
    if type(value) is not dict:
        raise _NotFlat
    items = []
    for k, v in value.items():
        if type(k) is not str or k[:2] == "__":
            raise _NotFlat  # a tagged dict (see encode._tag_dict)
        items.append(f"{_string(k)}:{_scalar(v)}")
    return "{" + ",".join(items) + "}"


def _scalar(value: Any) -> str:
    kind = type(value)
    if kind is str:
        return _string(value)
    if kind is int:
        return int.__repr__(value)
    if kind is float:
        if math.isfinite(value):
            return float.__repr__(value)
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if kind is bool or value is None:
        return _CONSTANTS[value]
    raise _NotFlat


def _bytes(value: bytes) -> str:
    """Bytes as tagged: base64 text, which JSON writes as it is."""
    return f'{{"{BYTES_TAG}":"{b2a_base64(value, newline=False).decode()}"}}'


#: Header names and Referer values written lately, as tagged: a crawl's requests share
#: their few header names, and a page's links their Referer. No other value: a header a
#: spider sets may hold a credential, which is kept only where the request is.
_TAGGED: dict[bytes, str] = {}
#: Most of them remembered (the longest 256 bytes: some 750 KB at most); a crawl of more
#: forgets them all and writes them again.
TAGGED_REMEMBERED = 1024
TAGGED_MAX_BYTES = 256


def _tagged(value: bytes) -> str:
    """:func:`_bytes`, remembered for the header names and Referers met again."""
    text = _TAGGED.get(value)
    if text is None:
        text = _bytes(value)
        if len(value) <= TAGGED_MAX_BYTES:
            remember(_TAGGED, value, text, TAGGED_REMEMBERED)
    return text


#: The stored headers of a request whose one header is its Referer, up to that value.
_REFERER_ONLY = f'{{"{DICT_TAG}":[[{_bytes(REFERER)},['


def _stored_headers(request: Request, spider: Spider | None, headers: Any) -> str | None:
    """*request*'s *headers* as stored (:func:`_headers` of what ``clean_headers`` keeps),
    None if none is kept. A spider's link has its Referer alone (RefererMiddleware's), which
    nothing cleans: written at once, without the general way's calls per request."""
    if len(headers) == 1 and type(headers) is Headers:
        values = dict.get(headers, REFERER)
        if type(values) is list and len(values) == 1 and type(values[0]) is bytes:
            return f"{_REFERER_ONLY}{_tagged(values[0])}]]]}}"
    clean = clean_headers(request, spider)
    return _headers(clean) if clean else None


def _headers(headers: dict[bytes, list[bytes]]) -> str:
    """Headers as tagged: a dict of bytes keys, ``{"__d": [[name, [values]], ...]}``."""
    pairs = []
    for name, values in headers.items():
        if type(name) is not bytes or any(type(v) is not bytes for v in values):
            raise _NotFlat
        tag = _tagged if name == REFERER else _bytes
        pairs.append(f"[{_tagged(name)},[{','.join(map(tag, values))}]]")
    return f'{{"{DICT_TAG}":[{",".join(pairs)}]}}'
