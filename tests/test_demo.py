"""The README's run command, small: three workers, one SIGKILLed, faults, a proxy, a report."""

from __future__ import annotations

import subprocess
import sys


def test_the_demo_reports_nothing_lost(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "scrapy_ha.demo.run", "--pages", "60", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out + result.stderr[-3000:]
    assert "OK: nothing was lost" in out
    assert "SIGKILLed worker 1" in out
    for line in ("items lost                                 0", "gone", "server",
                 "proxy password in any log             no"):  # fmt: skip
        assert line in out
