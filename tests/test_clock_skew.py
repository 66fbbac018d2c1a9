"""A worker whose clock is off the Redis server's says so when it joins (a QA run with
libfaketime: workers 30 s and 10 minutes ahead and behind ran silently, their log lines
timed 10 minutes away from what ``scrapy-ha status`` and ``workers`` show)."""

from __future__ import annotations

import logging

import pytest
import redis

from scrapy_ha.scheduler.remote import Remote
from scrapy_ha.store.wire import Counts


def _redis_now_ms(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        seconds, micros = client.time()
    finally:
        client.close()
    return seconds * 1000 + micros // 1000


@pytest.mark.parametrize(
    ("skew_s", "said"),
    [(600.0, "s ahead of the Redis"), (-600.0, "s behind the Redis"), (30.0, "s ahead")],
)
def test_a_worker_whose_clock_is_off_says_so_when_it_joins(redis_url, caplog, skew_s, said):
    """*skew_s*: how far this worker's clock is ahead of Redis's (the server's time as the
    join's counts would carry it from a worker so far off)."""
    now_ms = _redis_now_ms(redis_url) - int(skew_s * 1000)
    remote = Remote()
    with caplog.at_level(logging.WARNING, logger="scrapy_ha.scheduler.remote"):
        remote.counted(Counts(now_ms, 0, 0, 0, 0, 1, 0))
    assert remote.server_offset_ms == pytest.approx(-skew_s * 1000, abs=2000)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and said in warnings[0] and "NTP" in warnings[0]


def test_a_worker_on_time_says_nothing(redis_url, caplog):
    with caplog.at_level(logging.WARNING, logger="scrapy_ha.scheduler.remote"):
        Remote().counted(Counts(_redis_now_ms(redis_url), 0, 0, 0, 0, 1, 0))
    assert not caplog.records
