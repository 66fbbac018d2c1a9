"""The back-pressure marks keep their margin whatever their units. A QA run: with
``HA_REDIS_MEMORY_HIGH`` in bytes (what docs/reference.md asks for on a Redis without
maxmemory), the default low mark, a fraction, was taken as the high mark itself, so a crawl
stopped and started around one mark; a low mark in other units than the high one was taken
the same way, silently."""

from __future__ import annotations

import re

import pytest
from scrapy.settings import Settings

from scrapy_ha.config.memory import MemoryConfig
from scrapy_ha.config.validate import ConfigError

MB = 2**20


@pytest.mark.parametrize("maxmemory", [0, 100 * MB])
def test_a_high_mark_in_bytes_keeps_a_low_mark_under_it(maxmemory):
    config = MemoryConfig.from_settings(Settings({"HA_REDIS_MEMORY_HIGH": 9 * MB}))
    assert config.marks(maxmemory) == (9 * MB, 8 * MB)


def test_fractions_keep_theirs():
    assert MemoryConfig.from_settings(Settings()).marks(100 * MB) == (int(90 * MB), 80 * MB)
    assert MemoryConfig.from_settings(Settings()).marks(0) is None
    given = Settings({"HA_REDIS_MEMORY_HIGH": 9 * MB, "HA_REDIS_MEMORY_LOW": 5 * MB})
    assert MemoryConfig.from_settings(given).marks(0) == (9 * MB, 5 * MB)


@pytest.mark.parametrize(
    "settings",
    [
        {"HA_REDIS_MEMORY_HIGH": 3_000_000, "HA_REDIS_MEMORY_LOW": 0.5},
        {"HA_REDIS_MEMORY_LOW": 3_000_000},
    ],
)
def test_marks_of_two_units_are_refused_naming_both(settings):
    with pytest.raises(ConfigError, match=re.escape("must be of the same units")) as refused:
        MemoryConfig.from_settings(Settings(settings))
    assert "HA_REDIS_MEMORY_LOW=" in str(refused.value)
    assert "HA_REDIS_MEMORY_HIGH=" in str(refused.value)
