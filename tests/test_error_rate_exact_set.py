"""``HA_DUPEFILTER_ERROR_RATE`` with the exact set is named at start: the rate is the Bloom
filter's. A QA run: it was accepted silently."""

from __future__ import annotations

import logging

from scrapy import Spider
from scrapy.utils.test import get_crawler

from scrapy_ha.scheduler.shell import Scheduler


def _warnings(caplog, settings):
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        Scheduler.from_crawler(get_crawler(Spider, settings))
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_the_error_rate_with_the_exact_set_is_named_at_start(caplog):
    """A QA run: ``HA_DUPEFILTER_ERROR_RATE`` without ``HA_DUPEFILTER = "bloom"`` was
    accepted silently (the exact set never errs, so the rate asked did nothing)."""
    (warned,) = _warnings(caplog, {"HA_DUPEFILTER_ERROR_RATE": 1e-6})
    assert warned == (
        "HA_DUPEFILTER_ERROR_RATE does nothing with the exact set (HA_DUPEFILTER = 'set' "
        "never errs): it is the Bloom filter's, HA_DUPEFILTER = 'bloom'"
    )
    assert _warnings(caplog, {"HA_DUPEFILTER_ERROR_RATE": 1e-6, "HA_DUPEFILTER": "set"})
    assert _warnings(caplog, {"HA_DUPEFILTER_ERROR_RATE": 1e-6, "HA_DUPEFILTER": "bloom"}) == []
    assert _warnings(caplog, {"HA_DUPEFILTER": "bloom"}) == []
