"""A request is finished only when the engine holds it nowhere (scheduler.engine.busy_check):
not downloading, not queued for the scraper or scraped, not starting."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from scrapy import Request

from scrapy_ha.scheduler.engine import busy_check
from tests.test_scheduler_shell import FakeEngine


def _engine() -> FakeEngine:
    engine = FakeEngine()
    engine.scraper = SimpleNamespace(slot=SimpleNamespace(active=set(), queue=[]))
    return engine


@pytest.mark.parametrize(
    "place",
    [
        lambda e, r: e.downloader.active.add(r),
        lambda e, r: e.scraper.slot.active.add(r),
        lambda e, r: e.scraper.slot.queue.append((None, r, None)),
        lambda e, r: e._slot.inprogress.add(r),
    ],
    ids=["downloading", "scraped", "queued-for-the-scraper", "starting"],
)
def test_a_request_anywhere_in_the_engine_is_busy_and_nowhere_finished(place):
    engine = _engine()
    held, other = Request("http://a.test/1"), Request("http://a.test/2")
    place(engine, held)
    busy = busy_check(SimpleNamespace(engine=engine))
    assert busy(held)
    assert not busy(other)


def test_without_a_scraper_slot_or_an_engine_slot_only_the_downloader_counts():
    engine = _engine()
    engine.scraper.slot = None
    del engine._slot
    held = Request("http://a.test/1")
    engine.downloader.active.add(held)
    busy = busy_check(SimpleNamespace(engine=engine))
    assert busy(held)
    assert not busy(Request("http://a.test/2"))
