"""What never reaches Redis.

Credentials a worker adds again on every download never reach Redis:
``Proxy-Authorization`` and ``meta["_auth_proxy"]`` are dropped and a user:password in
``meta["proxy"]`` is cut out; the ``Authorization`` header HttpAuthMiddleware would add to
the request under the crawl's settings (from ``meta["http_user"]``/``meta["http_pass"]``,
the spider's ``http_user``/``http_pass``, or ``HTTPAUTH_USER``/``HTTPAUTH_PASS``, each
within its domain) and the ``Cookie`` header CookiesMiddleware rebuilds from its jar are
dropped too. A header the spider set itself is kept: a worker redoing the request needs it.
What is kept is masked wherever it is shown: :mod:`scrapy_ha.codec.masking`.

A request going back to Redis after its download (a retry, a revisit, a dead letter) loses
the headers the downloader middlewares put on it during that attempt
(:func:`drop_set_again`): Scrapy's ``User-Agent``, ``DEFAULT_REQUEST_HEADERS`` and
``Accept-Encoding``, the agent the pool (``HA_USER_AGENTS``) picked, a revisit's
validators. The next download sets them again, from the settings of the worker that does
it: a revisit gets the crawl's current agent and defaults (before, it kept its first
download's for ever: a new ``USER_AGENT`` or agent pool never reached it), and a stored
revisit holds some 200 bytes less. Headers it had when handed to the engine (the
spider's own) are kept, whatever their value. So is a ``download_timeout`` in its meta,
but the one DownloadTimeoutMiddleware sets on every request it downloads.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any

from scrapy.downloadermiddlewares.downloadtimeout import DownloadTimeoutMiddleware
from scrapy.downloadermiddlewares.httpauth import HttpAuthMiddleware
from scrapy.http.headers import Headers
from scrapy.utils.conf import build_component_list
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import load_object
from scrapy.utils.url import url_is_from_any_domain
from w3lib.http import basic_auth_header

from scrapy_ha import metakeys
from scrapy_ha.codec.masking import split_userinfo

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.http import Request
    from scrapy.settings import BaseSettings

#: Meta keys that make :func:`clean_meta` look closer (the cheap test for a plain request);
#: it never changes the value of another key.
SPECIAL_META = metakeys.STRIPPED | {"proxy", "download_slot", "_scheme_proxy", "download_timeout"}
#: Always dropped: proxy credentials never reach Redis (DESIGN, guarantee 7).
_PROXY_AUTH = b"Proxy-Authorization"
#: Whether a spider's own proxy credentials were said to be lost (once per process).
_PROXY_CREDENTIALS_WARNED: list[bool] = []
#: The public module's name: users filter the codec's warnings by it.
logger = logging.getLogger("scrapy_ha.codec")


# --------------------------------------------------------------------------- before storing


def clean_headers(request: Request, spider: Spider | None) -> dict[bytes, list[bytes]]:
    """The headers to store: without the credentials a middleware adds on every download."""
    headers = request.headers
    if not headers:
        return {}
    clean = {}
    for name, values in _header_items(headers):
        if name == _PROXY_AUTH:
            continue
        if name == b"Authorization" and _auth_added_by_middleware(request, spider, values):
            continue
        if name == b"Cookie" and _cookies_from_jar(request, spider):
            continue
        clean[name] = list(values)
    return clean


def drop_set_again(request: Request) -> None:
    """Take off *request* (downloaded, and going back to Redis) the headers a downloader
    middleware put on it during this attempt: those it did not have when the scheduler
    handed it to the engine (``meta["_ha_own_headers"]``). The next attempt's middlewares
    set them again, from the settings of the worker that makes it. A request the
    scheduler did not hand out (no such record) keeps every header."""
    own = request.meta.get(metakeys.OWN_HEADERS)
    if own is None:
        return
    headers = request.headers
    for name in [name for name in headers if name not in own]:
        del headers[name]


def _header_items(headers: Any) -> Any:
    """``headers.items()``: read as the dict it is when it is Scrapy's own ``Headers`` whose
    names are all as ``items()`` looks them up again (each name title-cased: ``items()``
    gives ``getlist(name)``, which normalizes the name again, a call per header); else
    through ``items()``, whose lookup of a name stored otherwise (a non-ASCII one, or one
    put in with ``|=``) gives no values."""
    if type(headers) is Headers and all(
        type(name) is bytes and name.title() == name for name in dict.keys(headers)
    ):
        return dict.items(headers)
    return headers.items()


def _auth_added_by_middleware(request: Request, spider: Spider | None, values: Any) -> bool:
    """Is this the header HttpAuthMiddleware adds (and adds again on the next download)?

    It adds one only to a request without an Authorization header: a header the spider
    set itself differs from the one it would add, or it would not add one there (another
    domain, the middleware switched off), and is kept: it is part of the request.
    """
    added = _middleware_auth(request, spider)
    return added is not None and len(values) == 1 and values[0] == added


def _middleware_auth(request: Request, spider: Spider | None) -> bytes | None:
    """The Authorization header HttpAuthMiddleware adds to *request* under the crawl's
    settings, or None: from the request's meta, else from the spider's attributes, else
    from ``HTTPAUTH_USER``/``HTTPAUTH_PASS``, each only within its domain."""
    if _switched_off(spider):
        return None
    settings = _settings(spider)
    meta = request.meta
    if meta.get("http_user") or meta.get("http_pass"):
        user, password = meta.get("http_user", ""), meta.get("http_pass", "")
        domain = meta.get("http_auth_domain")
    elif getattr(spider, "http_user", "") or getattr(spider, "http_pass", ""):
        user, password = getattr(spider, "http_user", ""), getattr(spider, "http_pass", "")
        domain = getattr(spider, "http_auth_domain", None)
    elif settings is not None and (settings.get("HTTPAUTH_USER") or settings.get("HTTPAUTH_PASS")):
        user, password = settings.get("HTTPAUTH_USER", ""), settings.get("HTTPAUTH_PASS", "")
        domain = settings.get("HTTPAUTH_DOMAIN")
    else:
        return None
    if domain and not url_is_from_any_domain(request.url, [domain]):
        return None
    try:
        return basic_auth_header(user, password)
    except (TypeError, AttributeError, UnicodeError):  # not text: the middleware fails too
        return None


def _settings(spider: Spider | None) -> BaseSettings | None:
    crawler = getattr(spider, "crawler", None)
    settings: BaseSettings | None = getattr(crawler, "settings", None)
    return settings


def _switched_off(spider: Spider | None) -> bool:
    """Is the crawl's HttpAuthMiddleware switched off (then nobody adds the header)?"""
    crawler = getattr(spider, "crawler", None)
    settings = getattr(crawler, "settings", None)
    return (
        crawler is not None
        and settings is not None
        and not _enabled(crawler, settings, HttpAuthMiddleware)
    )


#: Whether a crawl's downloader middleware of a class (or a subclass) is on, by class (its
#: settings are frozen).
_ON: weakref.WeakKeyDictionary[Crawler, dict[type, bool]] = weakref.WeakKeyDictionary()


def _enabled(crawler: Crawler, settings: BaseSettings, middleware: type) -> bool:
    """Is *middleware* among the crawl's downloader middlewares (Scrapy's are by default)?"""
    known = _ON.get(crawler)
    if known is not None and middleware in known:
        return known[middleware]
    try:
        paths = build_component_list(settings.getwithbase("DOWNLOADER_MIDDLEWARES"))
        classes = [load_object(p) if isinstance(p, str) else p for p in paths]
        enabled = any(isinstance(c, type) and issubclass(c, middleware) for c in classes)
    except Exception:  # a list Scrapy itself would refuse: assume Scrapy's default
        enabled = True
    if settings.frozen:
        _ON.setdefault(crawler, {})[middleware] = enabled
    return enabled


def _cookies_from_jar(request: Request, spider: Spider | None) -> bool:
    """Does CookiesMiddleware replace the Cookie header from its jar on the next download?

    It does unless ``dont_merge_cookies`` is set or ``COOKIES_ENABLED`` is off: then the
    header is the spider's own and is kept.
    """
    if request.meta.get("dont_merge_cookies"):
        return False
    crawler = getattr(spider, "crawler", None)
    return crawler is None or bool(crawler.settings.getbool("COOKIES_ENABLED", True))


def clean_meta(
    request: Request, meta: dict[str, Any], spider: Spider | None = None
) -> dict[str, Any]:
    """The meta to store: without per-attempt keys, proxy credentials, Scrapy's own slot,
    and the timeout DownloadTimeoutMiddleware set (see :func:`_is_default_timeout`)."""
    if SPECIAL_META.isdisjoint(meta):
        return meta
    clean = {k: v for k, v in meta.items() if k not in metakeys.STRIPPED}
    if clean.pop("_scheme_proxy", False):
        # HttpProxyMiddleware took the proxy from this worker's environment: the next
        # worker takes its own (the flag and the proxy go together, as in Scrapy's redirect)
        clean.pop("proxy", None)
    if isinstance(clean.get("proxy"), str):
        proxy = clean["proxy"]
        clean["proxy"] = strip_credentials(proxy)
        if clean["proxy"] != proxy and metakeys.PROXY not in meta:
            _say_proxy_credentials_lost(request)
    if "download_slot" in clean and _is_default_slot(request, clean["download_slot"]):
        del clean["download_slot"]  # the downloader's own key: it computes it again
    if "download_timeout" in clean and _is_default_timeout(spider, clean["download_timeout"]):
        del clean["download_timeout"]
    return clean


def _say_proxy_credentials_lost(request: Request) -> None:
    """The spider's own proxy credentials are not stored (DESIGN, guarantee 7), and no
    middleware of scrapy-ha adds them again (the add-on's proxy marks its requests with
    ``ha_proxy``): said once per process, since every request taken from Redis then
    reaches its proxy without them. Only where ``meta["proxy"]`` holds them as the request
    is stored, as a new request does: once downloaded, a request's credentials are in the
    ``Proxy-Authorization`` header HttpProxyMiddleware made, whoever gave them (a
    middleware that sets them at each attempt loses nothing)."""
    if _PROXY_CREDENTIALS_WARNED:
        return
    _PROXY_CREDENTIALS_WARNED.append(True)
    logger.warning(
        "The request for %s goes through a proxy whose credentials it carries itself "
        "(a user and password in the URL of its meta['proxy']): proxy credentials are never "
        "stored in Redis, so where another worker, a retry or a restarted worker takes such "
        "a request from Redis, it reaches the proxy without them (HTTP 407, dead-lettered "
        "as client). Give the proxy where every worker sets it again at each download: "
        "HA_PROXY_MODE and HA_PROXY_URL, the http_proxy/https_proxy environment of each "
        "worker, or a downloader middleware of yours before 750 that sets meta['proxy'] "
        "with them (this is logged once)",
        request.url,
    )


def _is_default_timeout(spider: Spider | None, timeout: Any) -> bool:
    """Is *timeout* the one the crawl's DownloadTimeoutMiddleware gives a request without
    one (the spider's ``download_timeout``, else ``DOWNLOAD_TIMEOUT``, as it reads them)?
    It sets it in the meta of every request it downloads; stored with a retry or a revisit,
    it held that request to the first worker's timeout for ever (a new ``DOWNLOAD_TIMEOUT``
    never reached it). The next download sets it again from the settings of the worker
    that does it. Kept: another value, and any where the middleware sets none (switched
    off, or a timeout of 0 or None: a request's own is then all the download has)."""
    crawler = getattr(spider, "crawler", None)
    settings = getattr(crawler, "settings", None)
    if crawler is None or settings is None:
        return False
    if not _enabled(crawler, settings, DownloadTimeoutMiddleware):
        return False
    try:
        default = getattr(spider, "download_timeout", settings.getfloat("DOWNLOAD_TIMEOUT"))
    except ValueError:  # no number: the middleware refuses it too (the crawl never starts)
        return False
    return bool(default) and type(timeout) in (int, float) and bool(timeout == default)


def _is_default_slot(request: Request, slot: Any) -> bool:
    """Is *slot* the key Scrapy's downloader wrote itself (the host, or its IP)?

    The downloader stores its slot key in ``meta["download_slot"]`` on every download; a
    slot the spider chose (for ``DOWNLOAD_SLOTS`` or to group hosts) differs and is kept.
    """
    from scrapy.resolver import dnscache  # noqa: PLC0415 - imported by Scrapy already

    host = urlparse_cached(request).hostname or ""
    return bool(slot == host or slot == dnscache.get(host, host))


def strip_credentials(url: str) -> str:
    """``http://user:pass@host:port`` -> ``http://host:port`` (a password holding ``/``,
    ``?`` or ``#`` unencoded too: :func:`~scrapy_ha.codec.masking.split_userinfo`)."""
    split = split_userinfo(url)
    if split is None:
        return url
    scheme, _, host, rest = split
    return f"{scheme}{host}{rest}"
