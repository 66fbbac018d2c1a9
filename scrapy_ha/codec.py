"""The request codec: Scrapy requests to compact, versioned JSON and back.

No pickle, and a payload is data, never a recipe for code: whoever can write to Redis
cannot make a worker import a module or call a function. Decoding builds only

- ``scrapy.Request`` and its subclasses, with the attributes the class declares in
  ``attributes`` (what ``Request.replace`` passes too);
- item classes (``scrapy.Item`` subclasses, dataclasses, attrs classes, pydantic models)
  and ``Enum`` members;
- bound methods of the spider as callbacks and errbacks: methods its own code defines
  (never a dunder), or Scrapy's own callbacks (``parse``, ``CrawlSpider``'s rules,
  ``SitemapSpider``'s sitemaps), never the spider's machinery (``_set_crawler``,
  ``start``...); found in the class namespaces (``inspect.getattr_static``), so no
  property runs;

and it resolves a class named in a payload only if its module is already imported
(``sys.modules``), by a plain look-up in the module's namespace: nothing is imported and
no module ``__getattr__`` runs. A class is built only if this worker trusts it: it encoded
it itself, it is defined in the spider's own top-level package, it is listed in
``HA_CODEC_CLASSES``, or it is a Request class of Scrapy. Every imported library has
dataclasses and Enums of its own (Twisted, redis, cryptography...), and building one runs
its ``__init__``, ``__post_init__`` or ``_missing_``: a payload must not pick among them.
Anything else is a :class:`CodecError` (the scheduler dead-letters such an entry as corrupt).

Every value Scrapy users put in ``meta`` and ``cb_kwargs`` round-trips with its type:
bytes, tuples, sets, frozensets, dicts with non-string keys, datetimes (naive and aware),
dates, times, timedeltas, Decimals, UUIDs, Enum members, items and nested requests are
tagged with short one-key objects (``{"__b": ...}``); plain JSON values are stored as
they are, so a plain request stays as small as it was.

Credentials never reach Redis: ``Proxy-Authorization`` and ``meta["_auth_proxy"]`` are
dropped and a user:password in ``meta["proxy"]`` is cut out; the ``Authorization`` header
that HttpAuthMiddleware adds (from ``http_user``/``http_pass``) and the ``Cookie`` header
that CookiesMiddleware rebuilds from its jar are dropped too, because those middlewares
add them again on every download. A header the spider set itself is kept.

The format: ``{"v": 1, "u": url, ...}`` where only fields that differ from Scrapy's
defaults are present.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import enum
import inspect
import json
import logging
import re
import sys
import uuid
from decimal import Decimal
from types import FunctionType, MethodType, ModuleType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from scrapy.http import Request
from scrapy.item import Item
from scrapy.utils.httpobj import urlparse_cached
from w3lib.http import basic_auth_header

from scrapy_ha import metakeys

try:  # attrs ships with Twisted, but an item class check must not need it
    import attr as _attr
except ImportError:  # pragma: no cover - Twisted depends on attrs
    _attr = None

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Spider

logger = logging.getLogger(__name__)

#: Version of the payload format; a payload with another version is refused. New tags were
#: added without a new version: every payload of an older scrapy-ha still reads the same.
FORMAT_VERSION = 1

#: What to do with a meta or cb_kwargs value that cannot be stored (``HA_UNSTORABLE``):
#: ``"error"`` raises :class:`CodecError`; ``"drop-key"`` stores the request without that key.
UNSTORABLE_POLICIES = ("error", "drop-key")

#: Meta keys that make :func:`_clean_meta` look closer (the cheap test for a plain request).
_SPECIAL_META = metakeys.STRIPPED | {"proxy", "download_slot", "_scheme_proxy"}
#: Always dropped: proxy credentials never reach Redis (DESIGN, guarantee 7).
_PROXY_AUTH = b"Proxy-Authorization"

# Short field names keep every queued request small in Redis memory.
# (request attribute, JSON key, Scrapy's default)
_FIELDS: tuple[tuple[str, str, Any], ...] = (
    ("method", "m", "GET"),
    ("body", "b", b""),
    ("cookies", "c", {}),
    ("meta", "mt", {}),
    ("_encoding", "e", "utf-8"),
    ("priority", "p", 0),
    ("dont_filter", "df", False),
    ("flags", "f", []),
    ("cb_kwargs", "k", {}),
)
#: The types a stored field may have where Scrapy's default does not say it.
_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {"c": (dict, list), "p": int}
_KNOWN_ATTRIBUTES = frozenset(
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
#: What a stored value may be, for error messages.
_STORABLE = (
    "str, numbers, bool, None, bytes, lists, tuples, sets, dicts, datetime/date/time/"
    "timedelta, Decimal, UUID, Enum members, items (scrapy.Item, dataclass, attrs, pydantic) "
    "and Requests"
)


class CodecError(ValueError):
    """A request cannot be serialized, or a payload cannot be read back."""


class _Unstorable(Exception):
    """A value that cannot be stored; ``path`` is filled in (innermost first) on the way out."""

    def __init__(self, kind: str, why: str) -> None:
        super().__init__(kind)
        self.kind = kind
        self.why = why
        self.path: list[str] = []

    def where(self) -> str:
        return "".join(reversed(self.path))


# --------------------------------------------------------------------------- encoding


def encode_request(request: Request, spider: Spider | None, *, unstorable: str = "error") -> bytes:
    """Serialize *request*; raise :class:`CodecError` naming the URL, the field and the type.

    With ``unstorable="drop-key"`` a ``meta`` or ``cb_kwargs`` key whose value cannot be
    stored is left out instead (a WARNING once per key and type).
    """
    doc = {"v": FORMAT_VERSION, **_encode_doc(request, spider, unstorable)}
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate: UTF-8 cannot hold it, a JSON escape can
        return json.dumps(doc, separators=(",", ":")).encode()


def _encode_doc(request: Request, spider: Spider | None, unstorable: str) -> dict[str, Any]:
    doc: dict[str, Any] = {"u": request.url}
    _put_callbacks(doc, request, spider)
    headers = _clean_headers(request, spider)
    if headers:
        doc["h"] = _tag_field(request, "headers", headers, spider, "error")
    for attr, key, default in _FIELDS:
        value = getattr(request, attr)
        if attr == "meta":
            value = _clean_meta(request, value)
        if value != default:
            doc[key] = _tag_field(request, attr.lstrip("_"), value, spider, unstorable)
    cls = type(request)
    if cls is not Request:
        doc["cls"] = _class_name(cls, request.url)
        for name in cls.attributes:
            if name not in _KNOWN_ATTRIBUTES:
                value = getattr(request, name)
                doc.setdefault("x", {})[name] = _tag_field(request, name, value, spider, "error")
    return doc


def _tag_field(
    request: Request, field: str, value: Any, spider: Spider | None, unstorable: str
) -> Any:
    try:
        try:
            return _tag(value, spider)
        except (_Unstorable, RecursionError):
            if unstorable != "drop-key" or field not in ("meta", "cb_kwargs"):
                raise
            return _tag(_without_unstorable(request, field, value, spider), spider)
    except _Unstorable as exc:
        raise CodecError(_unstorable_message(request.url, field, exc)) from None
    except RecursionError:
        raise CodecError(
            f"cannot store the request for {request.url}: its {field} is nested too deeply "
            f"(or refers to itself); store a flat copy of the data"
        ) from None


def _unstorable_message(url: str, field: str, exc: _Unstorable) -> str:
    return (
        f"cannot store the request for {url}: {field}{exc.where()} is of type {exc.kind}, "
        f"which scrapy-ha cannot store ({exc.why}). Store one of: {_STORABLE}; or set "
        f"HA_UNSTORABLE = 'drop-key' to leave such meta/cb_kwargs keys out"
    )


_DROPPED_WARNED: set[tuple[str, str, str]] = set()


def _without_unstorable(
    request: Request, field: str, value: dict[Any, Any], spider: Spider | None
) -> dict[Any, Any]:
    """*value* without the keys whose values cannot be stored (a WARNING once per key)."""
    kept = {}
    for k, v in value.items():
        try:
            _tag(v, spider)
        except (_Unstorable, RecursionError) as exc:
            kind = exc.kind if isinstance(exc, _Unstorable) else "recursive"
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


def _put_callbacks(doc: dict[str, Any], request: Request, spider: Spider | None) -> None:
    for attr, key in (("callback", "cb"), ("errback", "eb")):
        func = getattr(request, attr)
        if func is None:
            continue
        if isinstance(func, str):
            doc[key] = func
            continue
        doc[key] = _method_name(spider, func, request.url, attr)


def _method_name(spider: Spider | None, func: Callable[..., Any], url: str, attr: str) -> str:
    name = getattr(func, "__name__", "")
    bound = getattr(spider, name, None) if spider is not None else None
    if bound is not None and getattr(bound, "__func__", None) is getattr(func, "__func__", func):
        if not _callable_name(spider, name):
            raise CodecError(
                f"cannot store the request for {url} in Redis: its {attr} {name!r} is part "
                f"of Scrapy's spider machinery, which a worker never calls from a payload; "
                f"use a method of your own spider class"
            )
        return name
    raise CodecError(
        f"cannot store the request for {url} in Redis: its {attr} {func!r} is not a "
        f"method of the spider (use a spider method, pass data in cb_kwargs)"
    )


def _clean_headers(request: Request, spider: Spider | None) -> dict[bytes, list[bytes]]:
    """The headers to store: without the credentials a middleware adds on every download."""
    headers = request.headers
    if not headers:
        return {}
    clean = {}
    for name, values in headers.items():
        if name == _PROXY_AUTH:
            continue
        if name == b"Authorization" and _auth_added_by_middleware(request, spider, values):
            continue
        if name == b"Cookie" and _cookies_from_jar(request, spider):
            continue
        clean[name] = list(values)
    return clean


def _auth_added_by_middleware(request: Request, spider: Spider | None, values: Any) -> bool:
    """Is this the header HttpAuthMiddleware adds (and adds again on the next download)?

    It adds ``basic_auth_header(http_user, http_pass)`` from the request's meta, else from
    the spider's attributes, only when the request has no Authorization header: a header
    the spider set itself differs from both and is kept (it is part of the request).
    """
    meta = request.meta
    sources = (
        (meta.get("http_user", ""), meta.get("http_pass", "")),
        (getattr(spider, "http_user", ""), getattr(spider, "http_pass", "")),
    )
    candidates = [
        basic_auth_header(u, p)
        for u, p in sources
        if (u or p) and isinstance(u, str) and isinstance(p, str)
    ]
    return len(values) == 1 and values[0] in candidates


def _cookies_from_jar(request: Request, spider: Spider | None) -> bool:
    """Does CookiesMiddleware replace the Cookie header from its jar on the next download?

    It does unless ``dont_merge_cookies`` is set or ``COOKIES_ENABLED`` is off: then the
    header is the spider's own and is kept.
    """
    if request.meta.get("dont_merge_cookies"):
        return False
    crawler = getattr(spider, "crawler", None)
    return crawler is None or bool(crawler.settings.getbool("COOKIES_ENABLED", True))


def _clean_meta(request: Request, meta: dict[str, Any]) -> dict[str, Any]:
    if _SPECIAL_META.isdisjoint(meta):
        return meta
    clean = {k: v for k, v in meta.items() if k not in metakeys.STRIPPED}
    if clean.pop("_scheme_proxy", False):
        # HttpProxyMiddleware took the proxy from this worker's environment: the next
        # worker takes its own (the flag and the proxy go together, as in Scrapy's redirect)
        clean.pop("proxy", None)
    if isinstance(clean.get("proxy"), str):
        clean["proxy"] = strip_credentials(clean["proxy"])
    if "download_slot" in clean and _is_default_slot(request, clean["download_slot"]):
        del clean["download_slot"]  # the downloader's own key: it computes it again
    return clean


def _is_default_slot(request: Request, slot: Any) -> bool:
    """Is *slot* the key Scrapy's downloader wrote itself (the host, or its IP)?

    The downloader stores its slot key in ``meta["download_slot"]`` on every download; a
    slot the spider chose (for ``DOWNLOAD_SLOTS`` or to group hosts) differs and is kept.
    """
    from scrapy.resolver import dnscache  # noqa: PLC0415 - imported by Scrapy already

    host = urlparse_cached(request).hostname or ""
    return slot == host or slot == dnscache.get(host, host)


def strip_credentials(url: str) -> str:
    """``http://user:pass@host:port`` -> ``http://host:port``."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


#: Query parameters whose values are secrets (compared lower-case, ``-`` read as ``_``):
#: the usual names of API keys, tokens, passwords and signatures in proxy and API URLs.
_SECRET_PARAM = re.compile(
    r"(?:^|_)(?:key|apikey|token|secret|password|passwd|pwd|pass|sig|signature|auth|"
    r"authorization|credentials?|session|sessionid|sid)$"
)


def mask_url(url: str) -> str:
    """Hide the secrets of *url* for logs and errors.

    ``redis://user:secret@host`` -> ``redis://user:***@host``, and the values of query
    parameters named like secrets (``key``, ``api_key``, ``token``, ``access_token``,
    ``password``, ``secret``, ``sig``...) become ``***``.
    """
    parts = urlsplit(url)
    if "@" in parts.netloc:
        userinfo, host = parts.netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        parts = parts._replace(netloc=f"{user}:***@{host}")
    if parts.query:
        parts = parts._replace(query=_mask_query(parts.query))
    return urlunsplit(parts)


#: Meta keys whose values are secrets: a stored request needs them (HttpAuthMiddleware
#: rebuilds the Authorization header from them), a printed one never shows them.
_SECRET_META = ("http_pass",)


def mask_payload(doc: Any) -> Any:
    """A copy of a stored request (``json.loads`` of a payload) fit to print or log.

    ``meta["http_pass"]`` becomes ``***`` in the request and in every request nested in it;
    ``http_user`` and ``http_auth_domain`` say who and where, not the secret, and stay.
    """
    if isinstance(doc, list):
        return [mask_payload(v) for v in doc]
    if not isinstance(doc, dict):
        return doc
    masked = {k: mask_payload(v) for k, v in doc.items()}
    meta = masked.get("mt")
    if isinstance(meta, dict) and isinstance(meta.get("__d"), list):  # a meta with other keys
        meta["__d"] = [
            [p[0], "***"] if isinstance(p, list) and p and p[0] in _SECRET_META else p
            for p in meta["__d"]
        ]
    elif isinstance(meta, dict):
        masked["mt"] = {k: "***" if k in _SECRET_META else v for k, v in meta.items()}
    return masked


def _mask_query(query: str) -> str:
    pairs = query.split("&")
    for i, pair in enumerate(pairs):
        name, eq, _value = pair.partition("=")
        if eq and _SECRET_PARAM.search(name.lower().replace("-", "_")):
            pairs[i] = f"{name}=***"
    return "&".join(pairs)


# --------------------------------------------------------------------------- values

_PLAIN = frozenset((str, int, float, bool, type(None)))


def _tag(value: Any, spider: Spider | None) -> Any:
    """*value* as JSON data; raise :class:`_Unstorable` for what has no faithful form."""
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
            out.append(_tag(v, spider))
        except _Unstorable as exc:
            exc.path.append(f"[{i}]")
            raise
    return out


def _tag_dict(value: dict[Any, Any], spider: Spider | None) -> Any:
    try:
        if all(type(k) is str and k[:2] != "__" for k in value):
            return {k: _tag(v, spider) for k, v in value.items()}
        return {"__d": [[_tag(k, spider), _tag(v, spider)] for k, v in value.items()]}
    except _Unstorable as exc:
        exc.path.append(_failing_key(value, spider))
        raise


def _failing_key(value: dict[Any, Any], spider: Spider | None) -> str:
    """The ``[key]`` of *value* whose key or value cannot be stored (for the error's path)."""
    for k, v in value.items():
        for part in (k, v):
            try:
                _tag(part, spider)
            except _Unstorable:
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
    bytes: lambda v, s: {"__b": base64.b64encode(v).decode()},
    set: lambda v, s: {"__s": _tag_list(v, s)},
    frozenset: lambda v, s: {"__fs": _tag_list(v, s)},
    datetime.datetime: _tag_datetime,
    datetime.date: lambda v, s: {"__da": v.isoformat()},
    datetime.time: _tag_time,
    datetime.timedelta: lambda v, s: {"__td": [v.days, v.seconds, v.microseconds]},
    Decimal: lambda v, s: {"__dc": str(v)},
    uuid.UUID: lambda v, s: {"__u": v.hex},
}


def _tag_other(value: Any, spider: Spider | None) -> Any:  # noqa: PLR0911
    """Subclasses and classes named in the payload (Enums, items, requests)."""
    if isinstance(value, enum.Enum):
        return _tag_enum(value, spider)
    if isinstance(value, Request):
        return {"__r": _encode_nested(value, spider)}
    kind = _item_kind(type(value))
    if kind is not None:
        name = _class_name(type(value), None)
        return {"__i": [name, _tag_dict(_item_fields(value, kind), spider)]}
    for base in (bool, int, float, str):  # a subclass of a JSON type (not an Enum)
        if isinstance(value, base):
            return base(value)
    for base, encoder in _ENCODERS.items():  # a subclass (OrderedDict, a datetime subclass...)
        if isinstance(value, base):
            return encoder(
                base(value) if base in (list, dict, tuple, set, frozenset) else value, spider
            )
    raise _Unstorable(_type_name(type(value)), "not a data type scrapy-ha knows how to rebuild")


def _tag_enum(member: enum.Enum, spider: Spider | None) -> Any:
    cls = type(member)
    name = _class_name(cls, None)
    if member.name is not None and cls._member_map_.get(member.name) is member:
        return {"__e": [name, member.name]}
    return {"__e": [name, None, _tag(member.value, spider)]}  # a combination of Flag members


def _encode_nested(request: Request, spider: Spider | None) -> dict[str, Any]:
    try:
        return _encode_doc(request, spider, "error")
    except CodecError as exc:
        raise _Unstorable(_type_name(type(request)), str(exc)) from None


def _type_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# --------------------------------------------------------------------------- classes

#: Classes this process encoded (class -> stored name): a worker trusts what it stored.
_NAMES: dict[type, str] = {}
#: Setting listing more classes a payload may name (``module:Qualname`` or ``module.Class``).
CODEC_CLASSES_SETTING = "HA_CODEC_CLASSES"


def _class_name(cls: type, url: str | None) -> str:
    """``module:Qualname`` of *cls*, checked to resolve back to *cls* on decoding."""
    name = _NAMES.get(cls)
    if name is not None:
        return name
    name = f"{cls.__module__}:{cls.__qualname__}"
    try:
        found = _lookup(name)
    except CodecError:
        found = None
    if found is not cls:
        why = (
            f"the class {name} cannot be found again by its name: define it at a module's top level"
        )
        if url is not None:
            raise CodecError(f"cannot store the request for {url}: {why}")
        raise _Unstorable(_type_name(cls), why)
    _NAMES[cls] = name
    return name


def _lookup(name: str) -> Any:
    """The object *name* designates in an already imported module; never imports, never runs
    code (no ``getattr``: a module's ``__getattr__`` could import)."""
    module_name, sep, qualname = name.partition(":")
    if not sep:  # the form of older payloads: "package.module.Class"
        module_name, _, qualname = name.rpartition(".")
    module = sys.modules.get(module_name)
    if module is None:
        raise CodecError(
            f"the payload names {name!r}, whose module is not imported in this worker "
            f"(scrapy-ha never imports a module a payload names: import it in the spider's module)"
        )
    obj: Any = module
    for part in qualname.split("."):
        if not isinstance(obj, (ModuleType, type)):
            obj = None
            break
        obj = vars(obj).get(part)
    if obj is None:
        raise CodecError(f"the payload names {name!r}, which does not exist")
    return obj


def _trusted(cls: type, spider: Spider | None) -> bool:
    """May a payload make this worker build *cls*? (See the module docstring.)"""
    if cls in _NAMES or _is_scrapy_item(cls):
        return True  # a scrapy.Item is built by Scrapy's own __init__ (a dict of fields)
    module = cls.__module__ or ""
    if spider is not None:
        top = type(spider).__module__.partition(".")[0]
        if top not in ("scrapy", "builtins") and (module == top or module.startswith(top + ".")):
            return True
    return _listed(cls, spider)


def _is_scrapy_item(cls: type) -> bool:
    from scrapy import Item  # noqa: PLC0415 - imported by Scrapy already

    return issubclass(cls, Item) and "__init__" not in vars(cls)


def _listed(cls: type, spider: Spider | None) -> bool:
    settings = getattr(getattr(spider, "crawler", None), "settings", None)
    if settings is None:
        return False
    names = settings.getlist(CODEC_CLASSES_SETTING)
    return f"{cls.__module__}:{cls.__qualname__}" in names or _type_name(cls) in names


def _untrusted(name: str) -> CodecError:
    return CodecError(
        f"the payload names the class {name!r}, which this worker has not stored itself and "
        f"which is not defined in the spider's package: add it to {CODEC_CLASSES_SETTING} "
        f"to let payloads build it"
    )


def _item_kind(cls: type) -> str | None:
    """``"scrapy"``, ``"dataclass"``, ``"attrs"`` or ``"pydantic"`` for an item class."""
    if issubclass(cls, Item):
        return "scrapy"
    if dataclasses.is_dataclass(cls):
        return "dataclass"
    if _attr is not None and _attr.has(cls):
        return "attrs"
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and issubclass(cls, pydantic.BaseModel):
        return "pydantic"
    return None


def _item_fields(item: Any, kind: str) -> dict[str, Any]:
    if kind == "scrapy":
        return dict(item)
    if kind == "dataclass":
        return {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}
    if kind == "attrs":
        return {a.name: getattr(item, a.name) for a in _attr.fields(type(item))}
    return {name: getattr(item, name) for name in type(item).model_fields}


def _build_item(cls: type, kind: str, fields: dict[str, Any]) -> Any:
    if kind == "scrapy":
        return cls(fields)
    if kind == "pydantic":
        return cls.model_construct(**fields)  # type: ignore[attr-defined]
    if kind == "dataclass":
        spec = [(f.name, f.name, f.init) for f in dataclasses.fields(cls)]
    else:
        spec = [
            (a.name, getattr(a, "alias", a.name.lstrip("_")), a.init) for a in _attr.fields(cls)
        ]
    unknown = set(fields) - {name for name, _, _ in spec}
    if unknown:
        raise CodecError(f"{_type_name(cls)} has no fields {sorted(unknown)}")
    item = cls(**{arg: fields[name] for name, arg, init in spec if init and name in fields})
    for name, _arg, init in spec:
        if not init and name in fields:
            object.__setattr__(item, name, fields[name])
    return item


# --------------------------------------------------------------------------- decoding


def decode_request(payload: bytes | str, spider: Spider | None) -> Request:
    """Rebuild a request from :func:`encode_request` output; raise :class:`CodecError`.

    Every malformed payload raises :class:`CodecError`, whatever is wrong with it.
    """
    try:
        doc = json.loads(payload)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise CodecError(f"payload is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("v") != FORMAT_VERSION or "u" not in doc:
        raise CodecError(f"payload is not a scrapy-ha request of format {FORMAT_VERSION}")
    return _decode_doc(doc, spider)


def _decode_doc(doc: Any, spider: Spider | None) -> Request:
    url = doc.get("u") if isinstance(doc, dict) else None
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


def _request_kwargs(doc: dict[str, Any], spider: Spider | None) -> tuple[type, dict[str, Any]]:
    cls = _request_class(doc["cls"], spider) if "cls" in doc else Request
    kwargs: dict[str, Any] = {"url": doc["u"]}
    for attr, key, default in _FIELDS:
        if key in doc:
            value = _untag(doc[key], spider)
            if not isinstance(value, _FIELD_TYPES.get(key, type(default))):
                raise CodecError(f"its {attr.lstrip('_')} is a {type(value).__name__}")
            kwargs[attr.lstrip("_")] = value
    if "h" in doc:
        kwargs["headers"] = _untag(doc["h"], spider)
    extras = doc.get("x", {})
    if not isinstance(extras, dict):
        raise CodecError("its extra attributes are not an object")
    for name, value in extras.items():
        if name in _KNOWN_ATTRIBUTES or name not in cls.attributes:
            raise CodecError(f"{_type_name(cls)} takes no attribute {name!r}")
        kwargs[name] = _untag(value, spider)
    for attr, key in (("callback", "cb"), ("errback", "eb")):
        if key in doc:
            kwargs[attr] = _method(spider, doc[key])
    return cls, kwargs


def _request_class(name: Any, spider: Spider | None) -> type[Request]:
    cls = _lookup(name) if isinstance(name, str) else None
    if not (isinstance(cls, type) and issubclass(cls, Request)):
        raise CodecError(f"the payload names {name!r} as its class, which is not a Request class")
    if not (cls.__module__.startswith("scrapy.") or _trusted(cls, spider)):
        raise _untrusted(name)
    return cls


#: Methods defined by Scrapy's (and scrapy-ha's) own spider classes that serve as callbacks:
#: ``parse``, the rules of ``CrawlSpider`` and the sitemaps of ``SitemapSpider``. Every other
#: method those classes define (``_set_crawler``, ``start``, ``update_settings``...) is the
#: spider's machinery, which a payload must never make a worker call.
_FRAMEWORK_CALLBACKS = frozenset(("parse", "_parse", "_callback", "_errback", "_parse_sitemap"))
_FRAMEWORK_PACKAGES = frozenset(("scrapy", "scrapy_ha", "scrapy_redis"))


def _callable_name(spider: Spider, name: str) -> bool:
    """A callback name a payload may use: a method the spider's own code defines (public
    or private, never a dunder), or one of Scrapy's own callbacks (see above); found in the
    class namespaces, so nothing runs to find it."""
    if name.startswith("__"):
        return False
    for klass in type(spider).__mro__:
        if name in vars(klass):
            framework = klass.__module__.split(".")[0] in _FRAMEWORK_PACKAGES
            return not framework or name in _FRAMEWORK_CALLBACKS
    return False


def _method(spider: Spider | None, name: Any) -> Callable[..., Any]:
    """The spider's method *name*, bound to the spider.

    Only a plain function in the class namespaces (``inspect.getattr_static``: no property,
    no descriptor and no ``__getattr__`` runs to find it) that the spider's own code defines,
    or one of Scrapy's callbacks (:func:`_callable_name`): ``_set_crawler`` or ``__init__``
    are the spider's machinery, not callbacks.
    """
    ok = isinstance(name, str) and spider is not None and _callable_name(spider, name)
    try:
        func = inspect.getattr_static(type(spider), name) if ok else None
    except AttributeError:
        func = None
    if not isinstance(func, FunctionType):
        raise CodecError(f"the spider has no callback method {name!r}")
    return MethodType(func, spider)


def _untag(value: Any, spider: Spider | None) -> Any:
    cls = type(value)
    if cls is list:
        return [_untag(v, spider) for v in value]
    if cls is not dict:
        return value
    if len(value) == 1:
        ((key, inner),) = value.items()
        if key[:2] == "__":
            decoder = _DECODERS.get(key)
            if decoder is None:
                raise CodecError(f"unknown tag {key!r}")
            return decoder(inner, spider)
    return {k: _untag(v, spider) for k, v in value.items()}


def _list(value: Any, spider: Spider | None) -> list[Any]:
    if type(value) is not list:
        raise CodecError(f"a tagged value holds {type(value).__name__}, not a list")
    return [_untag(v, spider) for v in value]


def _text(value: Any) -> str:
    if type(value) is not str:
        raise CodecError(f"a tagged value holds {type(value).__name__}, not a string")
    return value


def _pairs(value: Any, spider: Spider | None) -> dict[Any, Any]:
    out = {}
    for pair in _list(value, spider):
        if type(pair) is not list or len(pair) != 2:
            raise CodecError("a tagged dict holds something else than [key, value] pairs")
        out[pair[0]] = pair[1]
    return out


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
    cls = _lookup(_text(value[0]))
    if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
        raise CodecError(f"the payload names {value[0]!r} as an Enum, which it is not")
    if not _trusted(cls, spider):
        raise _untrusted(value[0])
    if len(value) == 2:
        return cls._member_map_[_text(value[1])]
    return cls(_untag(value[2], spider))


def _untag_item(value: Any, spider: Spider | None) -> Any:
    if type(value) is not list or len(value) != 2:
        raise CodecError("a tagged item is not [class, fields]")
    cls = _lookup(_text(value[0]))
    kind = _item_kind(cls) if isinstance(cls, type) else None
    if kind is None:
        raise CodecError(f"the payload names {value[0]!r} as an item class, which it is not")
    if not _trusted(cls, spider):
        raise _untrusted(value[0])
    fields = _untag(value[1], spider)
    if type(fields) is not dict or not all(type(k) is str for k in fields):
        raise CodecError(f"the fields of a stored {value[0]} are not a dict of names")
    return _build_item(cls, kind, fields)


_DECODERS: dict[str, Callable[[Any, Spider | None], Any]] = {
    "__b": lambda v, s: base64.b64decode(_text(v), validate=True),
    "__t": lambda v, s: tuple(_list(v, s)),
    "__d": _pairs,
    "__s": lambda v, s: set(_list(v, s)),
    "__fs": lambda v, s: frozenset(_list(v, s)),
    "__dt": _untag_datetime,
    "__da": lambda v, s: datetime.date.fromisoformat(_text(v)),
    "__tm": _untag_time,
    "__td": lambda v, s: datetime.timedelta(*_timedelta_parts(v)),
    "__dc": lambda v, s: Decimal(_text(v)),
    "__u": lambda v, s: uuid.UUID(hex=_text(v)),
    "__e": _untag_enum,
    "__i": _untag_item,
    "__r": _decode_doc,
}


def _timedelta_parts(value: Any) -> list[int]:
    if type(value) is not list or len(value) != 3 or any(type(p) is not int for p in value):
        raise CodecError("a tagged timedelta is not [days, seconds, microseconds]")
    return value
