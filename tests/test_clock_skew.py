"""A worker whose clock is off the Redis server's says so when it joins (a QA run with
libfaketime: workers 30 s and 10 minutes ahead and behind ran silently, their log lines
timed 10 minutes away from what ``scrapy-ha status`` and ``workers`` show)."""

from __future__ import annotations

import logging

import pytest
import redis

from scrapy_ha.scheduler.remote import ClockSteps, Remote
from scrapy_ha.store.wire import Counts, SyncResult


def _redis_now_ms(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        seconds, micros = client.time()
    finally:
        client.close()
    return seconds * 1000 + micros // 1000


def _sync_result(now_ms: int) -> SyncResult:
    return SyncResult(now_ms, 0, 0, 0, 0, 0, 0)


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


def test_a_clock_set_forward_or_back_is_measured_against_the_monotonic_clock():
    steps = ClockSteps()
    assert steps.moved(wall=1000.0, mono=50.0) == 0.0  # the first call measures nothing
    assert steps.moved(wall=1010.0, mono=60.0) == 0.0  # both moved 10 s: no step
    assert steps.moved(wall=2230.0, mono=80.0) == pytest.approx(1200.0)  # an NTP step
    assert steps.moved(wall=1640.0, mono=90.0) == pytest.approx(-600.0)  # set back


def test_a_worker_whose_clock_is_set_forward_says_so(redis_url, caplog):
    """A QA run: a worker's clock set 20 minutes forward mid-crawl timed out a download
    on its way (Twisted's timers go by the wall clock), and the log said only
    ``DownloadTimeoutError``."""
    remote = Remote()
    remote.counted(Counts(_redis_now_ms(redis_url), 0, 0, 0, 0, 1, 0))
    remote.steps.wall -= 1200.0  # as if the wall clock had moved 20 minutes since
    with caplog.at_level(logging.WARNING, logger="scrapy_ha.scheduler.remote"):
        remote.clock(_sync_result(_redis_now_ms(redis_url)))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "was set 1200.0 s forward" in warnings[0]
