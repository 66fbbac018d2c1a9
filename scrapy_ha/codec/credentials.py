"""What never reaches Redis, and what is masked when a stored request is printed.

Credentials never reach Redis: ``Proxy-Authorization`` and ``meta["_auth_proxy"]`` are
dropped and a user:password in ``meta["proxy"]`` is cut out; the ``Authorization`` header
that HttpAuthMiddleware adds (from ``http_user``/``http_pass``) and the ``Cookie`` header
that CookiesMiddleware rebuilds from its jar are dropped too, because those middlewares
add them again on every download. A header the spider set itself is kept.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from scrapy.utils.httpobj import urlparse_cached
from w3lib.http import basic_auth_header

from scrapy_ha import metakeys
from scrapy_ha.codec.document import (
    BYTES_TAG,
    DICT_TAG,
    FIELDS,
    HEADERS,
    META,
    REQUEST_TAG,
    URL,
)

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.http import Request

#: Meta keys that make :func:`clean_meta` look closer (the cheap test for a plain request).
_SPECIAL_META = metakeys.STRIPPED | {"proxy", "download_slot", "_scheme_proxy"}
#: Always dropped: proxy credentials never reach Redis (DESIGN, guarantee 7).
_PROXY_AUTH = b"Proxy-Authorization"

#: Query parameters whose values are secrets (compared lower-case, ``-`` read as ``_``):
#: the usual names of API keys, tokens, passwords and signatures in proxy and API URLs.
_SECRET_PARAM = re.compile(
    r"(?:^|_)(?:key|apikey|token|secret|password|passwd|pwd|pass|sig|signature|auth|"
    r"authorization|credentials?|session|sessionid|sid)$"
)
#: Meta keys whose values are secrets: a stored request needs them (HttpAuthMiddleware
#: rebuilds the Authorization header from them), a printed one never shows them.
_SECRET_META = ("http_pass",)
#: Headers whose values are secrets. The codec keeps a header the spider set itself (a
#: worker redoing the request needs it); a printed request never shows its value.
SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "cookie", "x-api-key", "x-auth-token"}
)
#: The stored document's field of ``Request.cookies`` (every value is a secret).
_COOKIES = next(key for attr, key, _ in FIELDS if attr == "cookies")
#: What a printed request shows instead of a secret.
MASK = "***"


# --------------------------------------------------------------------------- before storing


def clean_headers(request: Request, spider: Spider | None) -> dict[bytes, list[bytes]]:
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


def clean_meta(request: Request, meta: dict[str, Any]) -> dict[str, Any]:
    """The meta to store: without per-attempt keys, proxy credentials and Scrapy's own slot."""
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
    return bool(slot == host or slot == dnscache.get(host, host))


def strip_credentials(url: str) -> str:
    """``http://user:pass@host:port`` -> ``http://host:port``."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


# --------------------------------------------------------------------------- before printing


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


def _mask_query(query: str) -> str:
    pairs = query.split("&")
    for i, pair in enumerate(pairs):
        name, eq, _value = pair.partition("=")
        if eq and _SECRET_PARAM.search(name.lower().replace("-", "_")):
            pairs[i] = f"{name}=***"
    return "&".join(pairs)


def mask_payload(doc: Any) -> Any:
    """A copy of a stored request (``json.loads`` of a payload) fit to print or log.

    The one masking every tool uses (``dlq show``, the dashboard, logs): in the request and
    in every request nested in its meta, ``meta["http_pass"]``, the values of secret headers
    (``Authorization``, ``Cookie``, API-key headers) and of cookies become ``***``, secret
    query values in the URL too; other header values are shown as text. ``http_user`` and
    ``http_auth_domain`` say who and where, not the secret, and stay.
    """
    masked = _mask_nested(doc)
    if isinstance(masked, dict):
        _mask_request_fields(masked)
    return masked


def _mask_nested(value: Any) -> Any:
    if isinstance(value, list):
        return [_mask_nested(v) for v in value]
    if not isinstance(value, dict):
        return value
    masked = {k: _mask_nested(v) for k, v in value.items()}
    _mask_meta(masked)
    nested = masked.get(REQUEST_TAG)
    if isinstance(nested, dict):
        _mask_request_fields(nested)
    return masked


def _mask_meta(doc: dict[str, Any]) -> None:
    meta = doc.get(META)
    if isinstance(meta, dict) and isinstance(meta.get(DICT_TAG), list):  # meta with other keys
        meta[DICT_TAG] = [
            [p[0], MASK] if isinstance(p, list) and p and p[0] in _SECRET_META else p
            for p in meta[DICT_TAG]
        ]
    elif isinstance(meta, dict):
        doc[META] = {k: MASK if k in _SECRET_META else v for k, v in meta.items()}


def _mask_request_fields(doc: dict[str, Any]) -> None:
    """Mask, in place, the headers, cookies and URL of one stored request document."""
    if HEADERS in doc:
        doc[HEADERS] = _masked_headers(doc[HEADERS])
    if isinstance(doc.get(_COOKIES), dict):
        doc[_COOKIES] = {k: MASK for k in doc[_COOKIES]}
    elif _COOKIES in doc:
        doc[_COOKIES] = MASK  # a list of cookie dicts, or a form this does not know
    if isinstance(doc.get(URL), str):
        doc[URL] = mask_url(doc[URL])


def _masked_headers(headers: Any) -> Any:
    """Headers as stored (a dict, or pairs under the dict tag when names are bytes) with
    secret values masked; a form this does not know is masked whole."""
    if isinstance(headers, dict) and isinstance(headers.get(DICT_TAG), list):
        pairs = headers[DICT_TAG]
        if all(isinstance(p, list) and len(p) == 2 for p in pairs):
            return {
                _text(k) or "?": MASK if _text(k).lower() in SECRET_HEADERS else _values(v)
                for k, v in pairs
            }
    elif isinstance(headers, dict):
        return {k: MASK if k.lower() in SECRET_HEADERS else _values(v) for k, v in headers.items()}
    return MASK


def _text(value: Any) -> str:
    """A stored string, or tagged bytes read as Latin-1 (``""`` for anything else)."""
    if isinstance(value, dict) and isinstance(value.get(BYTES_TAG), str):
        try:
            return base64.b64decode(value[BYTES_TAG]).decode("latin-1")
        except (binascii.Error, ValueError):
            return ""
    return value if isinstance(value, str) else ""


def _values(values: Any) -> Any:
    """Header values as text where they are tagged bytes."""
    if isinstance(values, list):
        return [_text(v) or v for v in values]
    return _text(values) or values
