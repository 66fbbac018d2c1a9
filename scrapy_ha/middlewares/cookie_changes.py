"""What a response changes in a cookie jar, worked out without reading the whole jar.

A response's ``Set-Cookie`` can delete a cookie (a past ``Expires``, ``Max-Age`` <= 0) that this
worker never loaded: the shared jar must drop it all the same, or every worker goes on sending
the cookie the server deleted. :func:`deletions` reads them from the response itself, with
``http.cookiejar``'s own rules (default domain and path), so they name the cookie exactly as
the jar does.
"""

from __future__ import annotations

import http.cookiejar
from typing import TYPE_CHECKING

from scrapy.http.cookies import WrappedRequest, WrappedResponse, potential_domain_matches
from scrapy.utils.httpobj import urlparse_cached

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.http import Response

__all__ = ["deletions", "request_domains"]


class _Deletions(http.cookiejar.CookieJar):
    """A scratch jar that records the cookies ``make_cookies`` deletes instead of deleting."""

    def __init__(self) -> None:
        super().__init__()
        self.deleted: list[tuple[str, str, str]] = []

    def clear(
        self, domain: str | None = None, path: str | None = None, name: str | None = None
    ) -> None:
        if domain is not None and path is not None and name is not None:
            self.deleted.append((domain, path, name))


def request_domains(request: Request) -> set[str]:
    """Every cookie domain a response to *request* may set or delete a cookie of (the
    request's host and the domains above it, as ``http.cookiejar`` names them)."""
    host = (urlparse_cached(request).hostname or "").lower()
    effective = host if "." in host else f"{host}.local"  # http.cookiejar's eff_request_host
    return set(potential_domain_matches(host)) | set(potential_domain_matches(effective))


def deletions(request: Request, response: Response) -> list[str]:
    """The ids (:func:`scrapy_ha.store.jars.cookie_id`) of the cookies *response* deletes, of
    the request's own domains only (a site does not delete another site's cookies in the
    shared jar)."""
    scratch = _Deletions()
    scratch.make_cookies(WrappedResponse(response), WrappedRequest(request))  # type: ignore[arg-type]
    if not scratch.deleted:
        return []
    domains = request_domains(request)
    return [f"{d}\t{p}\t{n}" for d, p, n in scratch.deleted if d in domains]
