"""bench/capacity.py still runs, on one server and on a 3-master cluster (a second each);
no rate is asserted, only that the simulated workers did whole rounds and Redis's work was
measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scrapy_ha.demo import harness

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("mode", [(), ("--cluster",)], ids=["one-server", "cluster"])
def test_capacity_bench_runs(mode: tuple[str, ...], tmp_path: Path) -> None:
    log = tmp_path / "capacity.out"
    args = ["--workers", "2", "--seconds", "1", "--idle", "0.2", "--batch", "5", *mode]
    with log.open("wb") as out:
        proc = harness.spawn(
            [sys.executable, str(ROOT / "bench" / "capacity.py"), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        code = proc.wait(180)
    finally:
        harness.stop(proc)  # its Redis servers and workers too, if it overran
    text = log.read_text()
    assert code == 0, text[-3000:]
    result = json.loads(text.strip().splitlines()[-1])
    assert result["servers"] == (3 if mode else 1) and result["shards"] == result["servers"]
    assert result["requests"] > 0 and result["redis_cpu_us_per_request"] > 0
    assert "fcall" in result["top_commands"]  # the sync script, as a function
    assert len(result["redis_core_share"]) == result["servers"]


def test_a_tree_put_first_on_the_path_is_the_package_capacity_measures(tmp_path: Path) -> None:
    """``script_cost.py --tree`` and ``script_phases.py --tree`` put another checkout first on
    the path, then import this module: before, it put its own checkout in front again, and
    script_phases measured the wrong tree."""
    import shutil

    root = Path(__file__).resolve().parent.parent
    shutil.copytree(root / "scrapy_ha", tmp_path / "scrapy_ha")
    code = (
        f"import sys; sys.path[:0] = [{str(tmp_path)!r}, {str(root / 'bench')!r}]; "
        "import capacity, scrapy_ha; print(scrapy_ha.__file__)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().startswith(str(tmp_path)), done.stdout
