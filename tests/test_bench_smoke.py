"""The benchmark still runs (a tiny site, one run each); no timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_quick(tmp_path):
    out = tmp_path / "results.json"
    subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--quick", "--out", str(out)],
                   check=True, capture_output=True, timeout=600)  # fmt: skip
    results = json.loads(out.read_text())
    for series in ("loopback", "latency"):
        assert set(results[series]["median"]) == {"memory", "scrapy-redis", "scrapy-ha"}
        assert results[series]["pages"] == 106
    assert results["micro"]["throughput"]["requests"] == 2000
