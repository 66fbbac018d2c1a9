"""A continuous crawl loses and doubles no revisit when a worker is SIGKILLed: bench/freshness.py's
soak (two real ``scrapy crawl`` workers revisiting the 1,000 pages of the freshness site at a
fixed interval, one SIGKILLed at a third of the run and started again, then
``scrapy-ha stop``), checked from Redis and from the site's log. The short version runs in
the default suite; the long one (10 minutes) is marked ``long``; the hour the docs report is
``python bench/freshness.py soak --seconds 3600``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scrapy_ha.demo import harness

ROOT = Path(__file__).resolve().parent.parent


def soak(tmp_path: Path, seconds: int, rate: int) -> dict:
    """The soak's result; its files (the workers' logs, Redis's) are kept in
    ``tmp_path / "work"``, and it leaves nothing in the temporary directory (before, a
    directory of them stayed there, one a run)."""
    out, log, temp = tmp_path / "soak.json", tmp_path / "soak.out", tmp_path / "tmp"
    temp.mkdir()
    args = [sys.executable, str(ROOT / "bench" / "freshness.py"), "soak", "--seconds"]
    args += [str(seconds), "--rate", str(rate), "--restart-after", "10", "--out", str(out)]
    args += ["--workdir", str(tmp_path / "work")]
    with log.open("wb") as stdout:
        env = {**os.environ, "TMPDIR": str(temp)}
        proc = harness.spawn(args, stdout=stdout, stderr=subprocess.STDOUT, env=env)
        try:
            code = proc.wait(seconds + 600)
        finally:
            harness.stop(proc)  # Redis, the site and the workers too, if it overran
    assert code == 0, log.read_text()[-3000:]
    assert not list(temp.iterdir()), list(temp.iterdir())
    return dict(json.loads(out.read_text()))


def check(result: dict) -> None:
    assert result["entries"] == result["pages_with_one_entry"] == 1000, result
    assert result["pages_with_more"] == 0 and result["revisit_double"] == 0, result
    assert result["pages_not_fetched_for_2_intervals"] == 0, result  # none lost
    assert result["pages_stopped_being_fetched"] == 0, result
    assert result["min_gap"] >= result["interval"] * 0.5, result  # none revisited twice as often


def test_a_killed_worker_loses_and_doubles_no_revisit(tmp_path: Path) -> None:
    check(soak(tmp_path, seconds=75, rate=50))


#: The ten-minute soak's own bound (its run, then up to 600 s to stop: soak's wait) and a
#: minute to stop what is left and check: past pytest's 300 s default (setup.cfg).
LONG_TIMEOUT = 600 + 600 + 60


@pytest.mark.long
@pytest.mark.timeout(LONG_TIMEOUT)
def test_a_killed_worker_loses_and_doubles_no_revisit_over_ten_minutes(tmp_path: Path) -> None:
    check(soak(tmp_path, seconds=600, rate=20))
