"""bench/frontier.py and bench/frontier_hol.py still run, small: the memory of a compacted
and a plain frontier (the compacted one smaller), Redis's CPU per request with where it
went, and a head-of-line crawl whose fast hosts are all crawled while a slow host's pages
take their time. No rate is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from scrapy_ha.demo import harness

ROOT = Path(__file__).resolve().parent.parent


def bench(script: str, *args: str, timeout: float = 240) -> object:
    """The JSON *script* prints last, run as a user runs it."""
    proc = harness.spawn(
        [sys.executable, str(ROOT / "bench" / script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        harness.stop(proc)  # its Redis server, site and workers too, if it overran
    text = out.decode()
    assert proc.returncode == 0, text[-3000:]
    return json.loads(text.strip().splitlines()[-1])


def test_the_frontier_bench_measures_memory_and_cpu() -> None:
    (compact,) = bench("frontier.py", "memory", "--pending", "20000", "--hosts", "100")
    (plain,) = bench("frontier.py", "memory", "--pending", "20000", "--hosts", "100", "--plain")
    assert compact["compacted"] and not plain["compacted"]
    assert compact["bytes_per_pending_request"] < plain["bytes_per_pending_request"]
    cpu = bench("frontier.py", "cpu", "--workers", "2", "--seconds", "1", "--frontier", "2000")
    assert cpu["requests"] > 0 and cpu["redis_cpu_us_per_request"] > 0
    assert "fcall" in cpu["commands"]  # the sync script, as a function


def test_the_head_of_line_bench_crawls_every_fast_page() -> None:
    args = ("--kinds", "slow", "--requests", "510", "--slow", "1", "--timeout", "120")
    result = bench("frontier_hol.py", *args)
    assert result["fast_pages"] == result["fast_expected"] == 500
    assert result["other_hits"] >= 1 and result["fast_pages_per_s"] > 0


def test_one_worker_without_limits_crawls_the_fast_hosts_while_a_slow_one_waits() -> None:
    """The defaults (no crawl-wide limits), one worker: the slow host's requests (pages
    of 60 s, 8 at once, 40 of them) fill half the worker's buffer. Before, the worker then
    leased little more until they drained: the fast hosts' 2,000 pages took 63 to 68 s
    on a quiet machine, and this run timed out. Now the worker's leases pass the slow host
    over: 3 to 5 s on a quiet machine."""
    args = ("--kinds", "slow", "--requests", "2040", "--slow", "60", "--timeout", "40")
    result = bench("frontier_hol.py", *args, "--workers", "1", "--concurrency", "0")
    assert result["fast_pages"] == result["fast_expected"] == 2000
