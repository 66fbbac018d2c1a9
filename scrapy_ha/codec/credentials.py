"""What never reaches Redis.

Credentials never reach Redis: ``Proxy-Authorization`` and ``meta["_auth_proxy"]`` are
dropped and a user:password in ``meta["proxy"]`` is cut out; the ``Authorization`` header
that HttpAuthMiddleware adds (from ``http_user``/``http_pass``) and the ``Cookie`` header
that CookiesMiddleware rebuilds from its jar are dropped too, because those middlewares
add them again on every download. A header the spider set itself is kept: a worker redoing
the request needs it. What is kept is masked wherever it is shown: :mod:`scrapy_ha.codec.masking`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from scrapy.utils.httpobj import urlparse_cached
from w3lib.http import basic_auth_header

from scrapy_ha import metakeys

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.http import Request

#: Meta keys that make :func:`clean_meta` look closer (the cheap test for a plain request).
_SPECIAL_META = metakeys.STRIPPED | {"proxy", "download_slot", "_scheme_proxy"}
#: Always dropped: proxy credentials never reach Redis (DESIGN, guarantee 7).
_PROXY_AUTH = b"Proxy-Authorization"


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
