"""The benchmark still runs (a tiny site, one run each); no timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from scrapy_ha.demo import harness

ROOT = Path(__file__).resolve().parent.parent
#: ``--quick``: 5 list pages of 20 items and the home page.
QUICK_PAGES = 5 * 21 + 1


def test_bench_quick(tmp_path: Path) -> None:
    """It leaves nothing in the temporary directory (before, the queue micro-benchmark's
    crawl left a directory of its output behind, one a memory size a run)."""
    out, log, temp = tmp_path / "results.json", tmp_path / "bench.out", tmp_path / "tmp"
    temp.mkdir()
    with log.open("wb") as stdout:
        proc = harness.spawn(
            [sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--out", str(out)],
            stdout=stdout,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TMPDIR": str(temp)},
        )
    try:
        code = proc.wait(600)
    finally:
        harness.stop(proc)  # Redis, the site and a crawl too, if it overran
    assert code == 0, log.read_text()[-3000:]
    assert not list(temp.iterdir()), list(temp.iterdir())
    results = json.loads(out.read_text())
    for series in ("loopback", "latency"):
        # every scheduler crawled the whole site, in each series
        assert results[series]["pages"] == {
            name: [QUICK_PAGES] for name in ("memory", "scrapy-redis", "scrapy-ha")
        }, results[series]
        assert all(rate > 0 for rate in results[series]["median"].values())
    assert results["micro"]["throughput"]["requests"] == 2000
