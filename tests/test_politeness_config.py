"""The settings of the crawl-wide per-domain limits: read, merged, refused when wrong."""

from __future__ import annotations

import pytest
from scrapy.settings import Settings

from scrapy_ha.config.politeness import DomainLimit, Politeness
from scrapy_ha.config.scheduler import SchedulerConfig
from scrapy_ha.config.validate import ConfigError


def politeness(**settings: object) -> Politeness:
    return SchedulerConfig.from_settings(Settings(settings)).politeness


def test_off_by_default():
    limits = politeness()
    assert not limits
    assert limits.as_hash() == {}
    assert not limits.limited("example.com")


def test_crawl_wide_values_and_per_domain_overrides_merge():
    limits = politeness(
        HA_DOMAIN_RATE=2.5,
        HA_DOMAIN_CONCURRENCY="4",
        HA_DOMAIN_LIMITS={"Slow.Example": {"rate": 0.5}, "fast.example": {"concurrency": 0}},
    )
    assert limits.limit_of("other.example") == DomainLimit(2.5, 4)
    assert limits.limit_of("slow.example") == DomainLimit(0.5, 4)  # the rest is the default
    assert limits.limit_of("fast.example") == DomainLimit(2.5, 0)
    assert limits.as_hash() == {"*": "2.5 4", "slow.example": "0.5 4", "fast.example": "2.5 0"}


def test_an_override_alone_limits_only_its_domain():
    limits = politeness(HA_DOMAIN_LIMITS='{"a.example": {"rate": 3, "concurrency": 1}}')
    assert limits.limited("a.example")
    assert not limits.limited("b.example")


def test_zero_and_none_mean_off():
    assert not politeness(HA_DOMAIN_RATE=0, HA_DOMAIN_CONCURRENCY=None)


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"HA_DOMAIN_RATE": -1}, "HA_DOMAIN_RATE=-1"),
        ({"HA_DOMAIN_RATE": "fast"}, "HA_DOMAIN_RATE='fast'"),
        ({"HA_DOMAIN_RATE": float("inf")}, "HA_DOMAIN_RATE=inf"),
        ({"HA_DOMAIN_CONCURRENCY": 1.5}, "HA_DOMAIN_CONCURRENCY=1.5"),
        ({"HA_DOMAIN_CONCURRENCY": -2}, "HA_DOMAIN_CONCURRENCY=-2"),
        ({"HA_DOMAIN_CONCURRENCY": True}, "HA_DOMAIN_CONCURRENCY=True"),
        ({"HA_DOMAIN_LIMITS": ["a.example"]}, "HA_DOMAIN_LIMITS=['a.example']"),
        ({"HA_DOMAIN_LIMITS": "{not json"}, "HA_DOMAIN_LIMITS='{not json'"),
        ({"HA_DOMAIN_LIMITS": {"http://a.example/": {"rate": 1}}}, "'http://a.example/'"),
        ({"HA_DOMAIN_LIMITS": {"a.example": 2}}, "HA_DOMAIN_LIMITS['a.example']=2"),
        ({"HA_DOMAIN_LIMITS": {"a.example": {"delay": 2}}}, "HA_DOMAIN_LIMITS['a.example']="),
        (
            {"HA_DOMAIN_LIMITS": {"a.example": {"rate": "x"}}},
            "HA_DOMAIN_LIMITS['a.example']['rate']='x'",
        ),
        (
            {"HA_DOMAIN_LIMITS": {"a.example": {"concurrency": 0.5}}},
            "HA_DOMAIN_LIMITS['a.example']['concurrency']=0.5",
        ),
    ],
)
def test_a_wrong_value_names_the_setting_and_the_value(settings, named):
    with pytest.raises(ConfigError) as info:
        politeness(**settings)
    assert named in str(info.value)
