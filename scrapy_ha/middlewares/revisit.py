"""Conditional revisits: ``RevisitMiddleware`` (a downloader middleware; the add-on puts it at
580, after HttpCompressionMiddleware on the way back, so that it sees decompressed bodies).

For a revisited request (``meta["ha_revisit"]`` or ``HA_REVISIT``) it sends the validators of
the URL's last full answer (``If-None-Match`` with its ``ETag``, ``If-Modified-Since`` with
its ``Last-Modified``; they replace the request's own, which a visit before may have left),
and tells what the visit found:

- a **304** to a conditional request: the page did not change (``not_modified``);
- a 2xx whose signature (a SHA-1 of the body, or of what ``HA_REVISIT_SIGNATURE`` says the
  content is) equals the last one: ``unchanged``;
- another 2xx: ``changed`` (``new`` at the first visit).

A page whose ``Last-Modified`` is its ``Date`` (within a second) on an answer whose content
did not change is served by a server that stamps every answer "now": its ``Last-Modified``
is ignored from then on (no ``If-Modified-Since``, no change dated by it, which would make
the page look as if it changed at the instant of every visit), and its signature alone
tells (``undated`` in its state), until an answer whose content did not change carries a
``Last-Modified`` more than a second before its ``Date``: it is used again from then on.

An unchanged page never reaches the spider's callback as a new page: the middleware raises
:class:`NotModified` (an ``IgnoreRequest``), so the callback is not called and Scrapy logs
nothing; the request's errback, if it has one, gets that failure, whose ``response`` is the
answer received (the 304, or the unchanged page). A changed page goes on to the callback
as usual. What it found travels to the scheduler in the request's meta, which keeps the
answer's validators and signature for the next visit and, with ``HA_REVISIT_ADAPTIVE``,
shrinks or grows the interval (:mod:`scrapy_ha.scheduler.revisits`).

The redirect target of a revisited request (carried under its lease) is told the same way,
against the page's state (``meta["_ha_revisit_target"]``), without validators either way:
an unchanged target does not reach the callback either.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

from scrapy.exceptions import IgnoreRequest

from scrapy_ha import metakeys
from scrapy_ha.config.continuous import CONDITIONAL_HEADERS, RevisitConfig, RevisitState
from scrapy_ha.config.startup import configured
from scrapy_ha.config.validate import ConfigError

if TYPE_CHECKING:
    from typing import Self

    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = ["NotModified", "RevisitMiddleware", "page_age", "signature_of"]

#: Hex digits of a SHA-1 kept as a page's signature: 64 bits, so two versions of one page
#: share a signature with odds ~5e-20, in 16 bytes stored per URL.
SIGNATURE_DIGITS = 16


class NotModified(IgnoreRequest):
    """A revisited page that did not change (a 304, or the same content): the callback is
    not called; an errback gets it, ``response`` being the answer received."""

    def __init__(self, response: Response, found: str) -> None:
        super().__init__(f"{response.url}: {found.replace('_', ' ')} since the last visit")
        self.response = response
        self.found = found


def signature_of(response: Response, custom: Any = None) -> str:
    """The signature of a page: a SHA-1 of *custom*'s view of it (``HA_REVISIT_SIGNATURE``:
    ``f(response) -> str | bytes``), else of its body."""
    content = response.body if custom is None else custom(response)
    data = content.encode() if isinstance(content, str) else bytes(content)
    return hashlib.sha1(data).hexdigest()[:SIGNATURE_DIGITS]  # noqa: S324 - not a secret


class RevisitMiddleware:
    """Downloader middleware: conditional requests and change detection for revisits."""

    def __init__(self, config: RevisitConfig) -> None:
        self.config = config

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(configured(crawler, RevisitConfig.from_settings))

    def _revisited(self, request: Request) -> bool:
        if not self.config.rules and metakeys.REVISIT not in request.meta:
            return False  # the usual case: nothing to match
        try:
            return self.config.interval_for(request.url, request.meta) is not None
        except ConfigError:
            return False  # the scheduler warns about it

    def _told_against(self, request: Request) -> RevisitState | None:
        """The state *request*'s answer is told against: a revisited request's own, a
        carried redirect's the page's (without validators); None: neither."""
        target = request.meta.get(metakeys.REVISIT_TARGET)
        if target is not None:
            return RevisitState.from_meta(target)
        if not self._revisited(request):
            return None
        return RevisitState.from_meta(request.meta.get(metakeys.REVISIT_STATE))

    def process_request(self, request: Request) -> None:
        if metakeys.REVISIT_TARGET in request.meta or not self._revisited(request):
            return  # (a redirect's target: sent without validators, the URL's are not its)
        state = RevisitState.from_meta(request.meta.get(metakeys.REVISIT_STATE))
        headers = request.headers  # stored with the request: those of the last visit are here
        for header in CONDITIONAL_HEADERS:  # the stored state's alone, or none
            headers.pop(header, None)
        if state.etag:
            headers[b"If-None-Match"] = state.etag
        if state.modified:
            headers[b"If-Modified-Since"] = state.modified

    def process_response(self, request: Request, response: Response) -> Response:
        if not (200 <= response.status < 300 or response.status == 304):
            return response  # a failure: the retry middleware's
        state = self._told_against(request)
        if state is None:
            return response
        if response.status == 304:
            if not (state.etag or state.modified):
                return response  # not an answer to our conditional request
            etag, modified = _validators(response)
            modified = "" if state.undated else modified or state.modified
            answer = replace(state, etag=etag or state.etag, modified=modified)
            self._found(request, "not_modified", answer)
            raise NotModified(response, "not_modified")
        etag, modified = _validators(response)
        signature = signature_of(response, self.config.signature)
        same = bool(state.visits) and state.signature == signature
        undated = _undated(state.undated, same, _lag(response, modified))
        if undated:
            modified = ""
        answer = RevisitState(
            etag=etag,
            modified=modified,
            signature=signature,
            size=len(response.body),
            age=page_age(response, modified),
            undated=undated,
        )
        if metakeys.REVISIT_TARGET in request.meta:  # the original URL sends none of these
            answer = replace(answer, etag="", modified="")
        if same:
            self._found(request, "unchanged", answer)
            raise NotModified(response, "unchanged")
        self._found(request, "changed" if state.visits else "new", answer)
        return response

    @staticmethod
    def _found(request: Request, found: str, answer: RevisitState) -> None:
        request.meta[metakeys.REVISIT_SEEN] = (found, answer)


def page_age(response: Response, modified: str) -> float:
    """Seconds the page had been unchanged when answered: its ``Date`` less its
    ``Last-Modified``, both the server's clock (-1: either missing or unreadable, the page
    modified after its date, or a ``Last-Modified`` before 1995: a placeholder)."""
    lag = _lag(response, modified)
    return lag if lag is not None and lag >= 0 else -1.0


#: How near its ``Date`` a ``Last-Modified`` is taken for "now": both are whole seconds,
#: stamped as the answer is made, so one second apart at most.
MODIFIED_NOW = 1.0


def _undated(was: bool, same: bool, lag: float | None) -> bool:
    """Whether the page's ``Last-Modified`` is ignored from this answer on (*was*: so far),
    *lag* its ``Date`` less its ``Last-Modified`` (None: either missing). An answer whose
    content did not change (*same*) tells: a ``Last-Modified`` that is its ``Date`` is a
    server that stamps every answer "now" (a dynamic page), not the page's last change;
    one more than a second before it is the page's own again (the server changed), and is
    used from then on. A changed answer, or one without both headers, tells nothing."""
    if not same or lag is None:
        return was
    if lag > MODIFIED_NOW:
        return False
    return was or abs(lag) <= MODIFIED_NOW


#: The earliest ``Last-Modified`` taken for a date (1995-01-01, before HTTP/1.0): an
#: earlier one is a server's placeholder (the epoch, 1970, for a file without a date),
#: which would count decades unchanged and hold the page at the longest interval.
MODIFIED_FLOOR = 788_918_400.0


def _lag(response: Response, modified: str) -> float | None:
    """``Date`` less ``Last-Modified`` in seconds (None: either missing or unreadable, or a
    ``Last-Modified`` before :data:`MODIFIED_FLOOR`)."""
    date = response.headers.get(b"Date")
    if not (modified and date):
        return None
    try:
        answered = parsedate_to_datetime(date.decode("latin-1")).timestamp()
        changed = parsedate_to_datetime(modified).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return answered - changed if changed >= MODIFIED_FLOOR else None


def _validators(response: Response) -> tuple[str, str]:
    headers = response.headers
    etag = headers.get(b"ETag") or b""
    modified = headers.get(b"Last-Modified") or b""
    return etag.decode("latin-1"), modified.decode("latin-1")
