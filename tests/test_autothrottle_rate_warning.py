"""AutoThrottle with a crawl-wide rate is named at start: a worker AutoThrottle holds back
sends the requests it leased late, on top of the rate (docs/scaling.md). It was silent."""

from __future__ import annotations

from tests.test_proxy_mode_unset import start_warnings

SAID = (
    "AUTOTHROTTLE_ENABLED with a crawl-wide rate (HA_DOMAIN_RATE, HA_DOMAIN_LIMITS): a "
    "worker AutoThrottle holds back sends the requests it leased seconds late, on top of "
    "the other workers' starts, so a domain may get more than its rate in a second; leave "
    "AutoThrottle off where the rate must hold (docs/scaling.md)"
)


def test_autothrottle_with_a_crawl_wide_rate_is_named_at_start(caplog):
    on = {"AUTOTHROTTLE_ENABLED": True}
    assert start_warnings(caplog, {**on, "HA_DOMAIN_RATE": 5}) == [SAID]
    limits = {"HA_DOMAIN_LIMITS": {"shop.example": {"rate": 2}}}
    assert start_warnings(caplog, {**on, **limits}) == [SAID]
    assert start_warnings(caplog, {**on, "HA_DOMAIN_CONCURRENCY": 2}) == []  # no rate
    assert start_warnings(caplog, {"HA_DOMAIN_RATE": 5}) == []  # AutoThrottle off
    assert start_warnings(caplog, {**on, "HA_DOMAIN_RATE": "fast"}) == []  # (its own error)
