"""The README's run command, small: three workers, one SIGKILLed, faults, a proxy, a report."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import TYPE_CHECKING

from scrapy_ha.demo import harness
from scrapy_ha.demo import run as demo_run
from scrapy_ha.demo.run import GONE_EVERY
from scrapy_ha.keys import Keys

if TYPE_CHECKING:
    from pathlib import Path

    import redis

PAGES, PER_PAGE = 60, 20
#: What the SIGKILLed worker can make the others redo: its prefetch buffer (16), its
#: unfinished requests (2 x 16) and one round of acks (16), as in the crash tests.
TWICE_BOUND = 4 * 16


def run_demo(tmp_path: Path, timeout: float = 300) -> tuple[int, str]:
    """The demo as a user runs it; stopped with everything it started if it overruns."""
    log = tmp_path / "demo.out"
    with log.open("wb") as out:
        proc = harness.spawn(
            [
                sys.executable,
                "-m",
                "scrapy_ha.demo.run",
                "--pages",
                str(PAGES),
                "--per-page",
                str(PER_PAGE),
                "--dir",
                str(tmp_path / "demo"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        code = proc.wait(timeout)
    finally:
        harness.stop(proc)
    return code, log.read_text(errors="replace")


def row(out: str, label: str) -> int:
    match = re.search(rf"^  {re.escape(label)}\s+(\d+)$", out, re.MULTILINE)
    assert match, f"no row {label!r} in the report:\n{out}"
    return int(match.group(1))


def test_the_demo_reports_nothing_lost(tmp_path: Path) -> None:
    code, out = run_demo(tmp_path)
    assert code == 0, out[-3000:]
    assert "OK: nothing was lost" in out
    assert "SIGKILLed worker 1" in out
    total = PAGES * PER_PAGE
    gone = total // GONE_EVERY
    assert row(out, "items expected (404s excluded)") == total - gone
    assert row(out, "unique items") == total - gone
    assert row(out, "items lost") == 0
    assert row(out, "gone (404) items dead-lettered as gone") == gone
    assert row(out, "items stored twice") <= TWICE_BOUND
    assert row(out, "leases reclaimed (worker 1's)") > 0  # the kill happened mid-crawl
    assert "proxy password in any log             no" in out


def test_the_kill_waits_for_a_count_of_leases_just_renewed(
    redis_client: redis.Redis, redis_url: str
) -> None:
    """A worker acks a renewal interval's worth of pages: a count of leases a second old
    may be leases it no longer holds, and a kill then reclaims nothing (the report's
    'leases reclaimed' row was 0 once in CI)."""
    key = Keys("ha", "catalogue").worker_stats
    seconds, micros = redis_client.time()
    now_ms = seconds * 1000 + micros // 1000
    redis_client.hset(key, "host:4242:ab12", f"{now_ms - 1000} " + json.dumps({"leases": 37}))
    assert demo_run._leases_of(redis_url, 4242) == 0
    redis_client.hset(key, "host:4242:ab12", f"{now_ms} " + json.dumps({"leases": 37}))
    assert demo_run._leases_of(redis_url, 4242) == 37
    assert demo_run._leases_of(redis_url, 4243) == 0
