"""A worker says when ``scrapy-ha seen forget`` changed the crawl's rules while it ran, not
when it first reads rules an earlier forget left: a review found every worker started on a
crawl ever forgotten from (a version above 0 for ever) logging "`scrapy-ha seen forget`
changed what the crawl has seen" at its first poll, with nothing changed."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import TYPE_CHECKING

from scrapy_ha.scheduler.admission import Admission
from scrapy_ha.store.forget import rules_of

if TYPE_CHECKING:
    import pytest

SAID = "`scrapy-ha seen forget` changed what the crawl has seen"


def _admission() -> Admission:
    return Admission(
        SimpleNamespace(),  # type: ignore[arg-type]
        dedupe=True,
        dedupe_start=True,
        debug=False,
        unstorable="error",
    )


def test_rules_an_earlier_forget_left_are_not_said_at_a_workers_first_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    admission = _admission()
    old = {b"v": b"3", b"p http://a.test/*": b"17"}
    with caplog.at_level(logging.INFO, logger="scrapy_ha.scheduler.admission"):
        admission.set_rules(rules_of(old))  # the first poll of a worker started now
        admission.set_rules(rules_of(old))
    assert admission.rules.version == 3
    assert SAID not in caplog.text


def test_a_forget_while_the_worker_runs_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    admission = _admission()
    with caplog.at_level(logging.INFO, logger="scrapy_ha.scheduler.admission"):
        admission.set_rules(rules_of({b"v": b"3", b"p http://a.test/*": b"17"}))
        admission.set_rules(rules_of({b"v": b"4", b"p http://a.test/*": b"17", b"d b.test": b"9"}))
        admission.set_rules(rules_of({b"v": b"4", b"p http://a.test/*": b"17", b"d b.test": b"9"}))
    (record,) = [r for r in caplog.records if SAID in r.getMessage()]
    assert "(forget 4; 1 domain and 1 pattern" in record.getMessage()


def test_a_first_forget_of_a_crawl_never_forgotten_is_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    admission = _admission()
    with caplog.at_level(logging.INFO, logger="scrapy_ha.scheduler.admission"):
        admission.set_rules(rules_of({}))  # version 0: nothing forgotten yet
        admission.set_rules(rules_of({b"v": b"1", b"d b.test": b"9"}))
    assert caplog.text.count(SAID) == 1
