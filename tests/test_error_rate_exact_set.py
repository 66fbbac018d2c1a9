"""``HA_DUPEFILTER_ERROR_RATE`` with the exact set is named at start: the rate is the Bloom
filter's. A QA run: it was accepted silently."""

from __future__ import annotations

from tests.test_proxy_mode_unset import start_warnings


def test_the_error_rate_with_the_exact_set_is_named_at_start(caplog):
    """A QA run: ``HA_DUPEFILTER_ERROR_RATE`` without ``HA_DUPEFILTER = "bloom"`` was
    accepted silently (the exact set never errs, so the rate asked did nothing)."""
    (warned,) = start_warnings(caplog, {"HA_DUPEFILTER_ERROR_RATE": 1e-6})
    assert warned == (
        "HA_DUPEFILTER_ERROR_RATE does nothing with the exact set (HA_DUPEFILTER = 'set' "
        "never errs): it is the Bloom filter's, HA_DUPEFILTER = 'bloom'"
    )
    assert start_warnings(caplog, {"HA_DUPEFILTER_ERROR_RATE": 1e-6, "HA_DUPEFILTER": "set"})
    assert (
        start_warnings(caplog, {"HA_DUPEFILTER_ERROR_RATE": 1e-6, "HA_DUPEFILTER": "bloom"}) == []
    )
    assert start_warnings(caplog, {"HA_DUPEFILTER": "bloom"}) == []
