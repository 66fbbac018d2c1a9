"""The validators a revisited page's answers carry (``ETag``, ``Last-Modified``), through
the real middleware and the scheduler's revisit end: a conditional request sends those of
the last full answer alone, never one an earlier visit left in the stored request."""

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
    """One revisited page: each visit sends what the middleware says, answers *headers*."""

    def __init__(self, config: RevisitConfig | None = None) -> None:
        config = config or RevisitConfig()
        self.now = [float(T0)]
        self.middleware = RevisitMiddleware(config)
        self.revisits = Revisits(config, lambda r: b"fp", clock=lambda: self.now[0])
        self.request = Request("http://a.example/p", meta={"ha_revisit": 100})
        self.sent: list[dict[bytes, bytes | None]] = []

    def visit(self, at: float, body: bytes, **headers: str) -> RevisitState:
        self.now[0] = T0 + at
        self.middleware.process_request(self.request)
        sent = self.request.headers
        self.sent.append({h: sent.get(h) for h in (b"If-None-Match", b"If-Modified-Since")})
        headers = {"Date": http_date(T0 + at), **headers}
        response = HtmlResponse(self.request.url, headers=headers, body=body)
        try:
            self.middleware.process_response(self.request, response)
        except NotModified:
            pass
        assert self.revisits.visit_end(self.request) is not None
        return RevisitState.from_meta(self.request.meta[metakeys.REVISIT_STATE])


def test_validators_the_site_stopped_sending_are_not_sent_again():
    """Before, an ``If-None-Match`` or ``If-Modified-Since`` of an earlier visit stayed in
    the stored request once the site stopped sending ``ETag``/``Last-Modified``: each later
    visit asked with stale validators, and a 304 to them was read as "not modified"."""
    page = Page()
    page.visit(0, b"A", ETag='"a"', **{"Last-Modified": http_date(T0 - 50)})
    page.visit(100, b"B")  # the site sends neither any more
    page.visit(200, b"B")
    assert page.sent[1] == {
        b"If-None-Match": b'"a"',
        b"If-Modified-Since": b"Tue, 14 Nov 2023 22:12:30 GMT",
    }
    assert page.sent[2] == {b"If-None-Match": None, b"If-Modified-Since": None}


def test_a_validator_of_the_request_s_own_is_replaced_by_the_stored_state():
    page = Page()
    page.request.headers[b"If-None-Match"] = b'"mine"'  # set by the spider, or a visit before
    page.visit(0, b"A")
    assert page.sent[0] == {b"If-None-Match": None, b"If-Modified-Since": None}


def test_a_last_modified_of_1970_is_no_evidence_of_a_page_unchanged_for_decades():
    """Before, a first answer's ``Last-Modified: Thu, 01 Jan 1970`` (what a server sends for
    a file without a date) counted 1.7e9 s unchanged: the page's interval stayed near the
    longest whatever its visits found later."""
    config = RevisitConfig(adaptive=True)
    bogus, none = Page(config), Page(config)
    first = bogus.visit(0, b"A", **{"Last-Modified": http_date(0)})
    assert first.unchanged_for == 0
    assert first.interval == none.visit(0, b"A").interval  # as without a Last-Modified


def test_a_first_visit_counts_its_age_up_to_the_longest_interval():
    """A page unchanged for five years is given what one unchanged for HA_REVISIT_MAX is:
    one look does not outweigh what the visits after it find."""
    config = RevisitConfig(adaptive=True)
    old, month = Page(config), Page(config)
    first = old.visit(0, b"A", **{"Last-Modified": http_date(T0 - 5 * 365 * 86400)})
    assert first.unchanged_for == config.maximum
    assert (
        first.interval
        == month.visit(0, b"A", **{"Last-Modified": http_date(T0 - config.maximum)}).interval
    )
    # then found changed at each visit (dated by its Last-Modified): its interval falls
    at, intervals = 0.0, [first.interval]
    for version in range(5):
        at += intervals[-1]
        changed = {"Last-Modified": http_date(T0 + at - 10)}
        intervals.append(old.visit(at, b"B%d" % version, **changed).interval)
    assert intervals[-1] < intervals[0] / 3, intervals
