"""The request codec: Scrapy requests to compact, versioned JSON and back.

No pickle: a payload is data, never code, so whoever can write to Redis cannot
run code on the workers. Bytes, tuples and dicts with non-string keys are
tagged so that headers, bodies, meta and ``cb_kwargs`` round-trip exactly.
Proxy credentials (the ``Proxy-Authorization`` header, ``meta["_auth_proxy"]``
and a user:password in ``meta["proxy"]``) are stripped before anything is
stored.

The format: ``{"v": 1, "u": url, ...}`` where only fields that differ from
Scrapy's defaults are present.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from scrapy.http import Request
from scrapy.utils.misc import load_object

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Spider

logger = logging.getLogger(__name__)

#: Version of the payload format; a payload with another version is refused.
FORMAT_VERSION = 1

#: Meta key holding the lease of a request handed out by the scheduler
#: (never stored: each lease gets a new one).
LEASE_META_KEY = "ha_lease"
#: Meta key set on every request a callback yields: the lease ``(entry id, token)`` of the
#: page that yielded it. A child is enqueued only while its parent's lease is held, and an
#: unstorable child fails its parent (never stored).
PARENT_META_KEY = "_ha_parent"
#: What to do with a meta or cb_kwargs value that cannot be stored (``HA_UNSTORABLE``):
#: ``"error"`` raises :class:`CodecError`; ``"drop-key"`` stores the request without that key.
UNSTORABLE_POLICIES = ("error", "drop-key")

_STRIPPED_META = (
    LEASE_META_KEY, PARENT_META_KEY, "ha_outcome", "_ha_cp_save", "_ha_suspect", "_auth_proxy",
    "download_slot",
)
_STRIPPED_HEADERS = (b"Proxy-Authorization",)

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


class CodecError(ValueError):
    """A request cannot be serialized, or a payload cannot be read back."""


def encode_request(
    request: Request, spider: Spider | None, *, unstorable: str = "error"
) -> bytes:
    """Serialize *request*; raise :class:`CodecError` naming the URL and the field.

    With ``unstorable="drop-key"`` a ``meta`` or ``cb_kwargs`` key whose value cannot be
    stored is left out instead (a WARNING once per key).
    """
    doc: dict[str, Any] = {"v": FORMAT_VERSION, "u": request.url}
    _put_callbacks(doc, request, spider)
    headers = _clean_headers(request)
    if headers:
        doc["h"] = _tag(headers, f"{request.url}: headers")
    for attr, key, default in _FIELDS:
        value = getattr(request, attr)
        if attr == "meta":
            value = _clean_meta(value)
        if value == default:
            continue
        if attr in ("meta", "cb_kwargs") and unstorable == "drop-key":
            doc[key] = _tag_keys(value, f"{request.url}: {attr}")
        else:
            doc[key] = _tag(value, f"{request.url}: {attr}")
    if type(request) is not Request:
        doc["cls"] = f"{type(request).__module__}.{type(request).__name__}"
    for name in getattr(request, "attributes", ()):
        if name not in doc and name not in _KNOWN_ATTRIBUTES:
            doc.setdefault("x", {})[name] = _tag(getattr(request, name), f"{request.url}: {name}")
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def decode_request(payload: bytes | str, spider: Spider | None) -> Request:
    """Rebuild a request from :func:`encode_request` output; raise :class:`CodecError`."""
    try:
        doc = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CodecError(f"payload is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("v") != FORMAT_VERSION or "u" not in doc:
        raise CodecError(f"payload is not a scrapy-ha request of format {FORMAT_VERSION}")
    kwargs: dict[str, Any] = {"url": doc["u"]}
    for attr, key, _default in _FIELDS:
        if key in doc:
            kwargs[attr.lstrip("_")] = _untag(doc[key])
    if "h" in doc:
        kwargs["headers"] = _untag(doc["h"])
    kwargs.update({k: _untag(v) for k, v in doc.get("x", {}).items()})
    for attr, key in (("callback", "cb"), ("errback", "eb")):
        if key in doc:
            kwargs[attr] = _method(spider, doc[key])
    try:
        cls = load_object(doc["cls"]) if "cls" in doc else Request
        return cls(**kwargs)
    except Exception as exc:
        raise CodecError(f"cannot rebuild the request for {doc['u']}: {exc}") from None


_KNOWN_ATTRIBUTES = frozenset(
    ("url", "callback", "errback", "headers", "method", "body", "cookies", "meta",
     "encoding", "priority", "dont_filter", "flags", "cb_kwargs")
)  # fmt: skip


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
        return name
    raise CodecError(
        f"cannot store the request for {url} in Redis: its {attr} {func!r} is not a "
        f"method of the spider (use a spider method, pass data in cb_kwargs)"
    )


def _method(spider: Spider | None, name: str) -> Callable[..., Any]:
    method = getattr(spider, name, None)
    if not callable(method):
        raise CodecError(f"the spider has no method {name!r}")
    return method  # type: ignore[no-any-return]


def _clean_headers(request: Request) -> dict[bytes, list[bytes]]:
    return {k: list(v) for k, v in request.headers.items() if k not in _STRIPPED_HEADERS}


def _clean_meta(meta: dict[str, Any]) -> dict[str, Any]:
    if not any(k in meta for k in (*_STRIPPED_META, "proxy")):
        return meta
    clean = {k: v for k, v in meta.items() if k not in _STRIPPED_META}
    if isinstance(clean.get("proxy"), str):
        clean["proxy"] = strip_credentials(clean["proxy"])
    return clean


def strip_credentials(url: str) -> str:
    """``http://user:pass@host:port`` -> ``http://host:port``."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def mask_url(url: str) -> str:
    """``redis://user:secret@host`` -> ``redis://user:***@host`` (for logs and errors)."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    userinfo, host = parts.netloc.rsplit("@", 1)
    user = userinfo.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _tag(value: Any, where: str) -> Any:  # noqa: PLR0911
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, bytes):
        return {"__b": base64.b64encode(value).decode()}
    if isinstance(value, list):
        return [_tag(v, where) for v in value]
    if isinstance(value, tuple):
        return {"__t": [_tag(v, where) for v in value]}
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: _tag(v, f"{where}[{k!r}]") for k, v in value.items()}
        return {"__d": [[_tag(k, where), _tag(v, f"{where}[{k!r}]")] for k, v in value.items()]}
    raise CodecError(
        f"cannot store the request for {where} in Redis: a value of type "
        f"{type(value).__name__} is not serializable (use str, bytes, numbers, lists, dicts)"
    )


_DROPPED_WARNED: set[str] = set()


def _tag_keys(value: dict[str, Any], where: str) -> Any:
    """Tag a meta or cb_kwargs dict key by key, leaving out keys that cannot be stored."""
    kept = {}
    for k, v in value.items():
        try:
            _tag(v, f"{where}[{k!r}]")
        except CodecError as exc:
            if k not in _DROPPED_WARNED:
                _DROPPED_WARNED.add(k)
                logger.warning("%s; the key is left out (HA_UNSTORABLE = 'drop-key')", exc)
            continue
        kept[k] = v
    return _tag(kept, where)


def _untag(value: Any) -> Any:
    if isinstance(value, list):
        return [_untag(v) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        if "__b" in value:
            return base64.b64decode(value["__b"])
        if "__t" in value:
            return tuple(_untag(v) for v in value["__t"])
        if "__d" in value:
            return {_untag(k): _untag(v) for k, v in value["__d"]}
    return {k: _untag(v) for k, v in value.items()}
