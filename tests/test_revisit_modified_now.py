"""A site whose ``Last-Modified`` is always "now" (its ``Date``): the revisit middleware finds
it out on a page that did not change and falls back to the body's signature for that page,
so its changes are not dated "at the instant of the visit" (which made every page look as if
it changed at each visit) and no ``If-Modified-Since`` is sent; an honest ``Last-Modified``
still dates a change."""

from __future__ import annotations

from email.utils import formatdate

from scrapy import Request
from scrapy.http import HtmlResponse

from scrapy_ha import metakeys
from scrapy_ha.config.continuous import RevisitConfig, RevisitState
from scrapy_ha.revisit import NotModified, RevisitMiddleware
from scrapy_ha.scheduler.revisits import Revisits

T0 = 1_700_000_000


def http_date(t: float) -> str:
    return formatdate(t, usegmt=True)


class Page:
    """One revisited page through the real middleware and the scheduler's revisit end."""

    def __init__(self) -> None:
        config = RevisitConfig(adaptive=True)
        self.now = [float(T0)]
        self.middleware = RevisitMiddleware(config)
        self.revisits = Revisits(config, lambda r: b"fp", clock=lambda: self.now[0])
        self.request = Request("http://a.example/p", meta={"ha_revisit": 100})
        self.sent: list[bytes | None] = []

    def visit(self, at: float, body: bytes, modified: float) -> RevisitState:
        self.now[0] = T0 + at
        self.middleware.process_request(self.request)
        self.sent.append(self.request.headers.get(b"If-Modified-Since"))
        headers = {"Date": http_date(T0 + at), "Last-Modified": http_date(T0 + modified)}
        response = HtmlResponse(self.request.url, headers=headers, body=body)
        try:
            self.middleware.process_response(self.request, response)
        except NotModified:
            pass
        assert self.revisits.visit_end(self.request) is not None
        return RevisitState.from_meta(self.request.meta[metakeys.REVISIT_STATE])


def test_a_last_modified_always_now_is_ignored_once_found_on_an_unchanged_page():
    page = Page()
    page.visit(0, b"A", modified=0)
    second = page.visit(100, b"A", modified=100)  # unchanged, yet "modified" now: found out
    assert second.undated and second.modified == ""
    third = page.visit(200, b"B", modified=200)  # changed somewhere in the last 100 s
    assert (third.changed, third.changed_for, third.dated) == (1, 100.0, 0)  # not "just now"
    assert third.undated and third.modified == ""
    assert page.sent[2] is None  # no If-Modified-Since: it would always say "modified"


def test_an_honest_last_modified_still_dates_a_change():
    page = Page()
    page.visit(0, b"A", modified=-500)
    second = page.visit(100, b"A", modified=-500)
    assert not second.undated and second.modified == http_date(T0 - 500)
    third = page.visit(200, b"B", modified=150)  # changed 50 s before the visit
    assert (third.changed, third.dated, third.unchanged_for) == (0, 1, 500 + 100 + 50)
    assert page.sent[2] == http_date(T0 - 500).encode()


def test_a_last_modified_found_honest_again_is_used_again():
    """``undated`` is not for ever: the server starts sending the page's own Last-Modified
    (more than a second before Date, on an unchanged page): it is kept and sent again."""
    page = Page()
    page.visit(0, b"A", modified=0)
    assert page.visit(100, b"A", modified=100).undated  # found out
    assert page.visit(200, b"B", modified=200).undated  # a changed page tells nothing
    honest = page.visit(300, b"B", modified=150)  # unchanged, and modified 150 s before
    assert not honest.undated and honest.modified == http_date(T0 + 150)
    page.visit(400, b"B", modified=150)
    assert page.sent[4] == http_date(T0 + 150).encode()  # If-Modified-Since again
