"""The static-site benchmark: nginx serves the demo catalogue byte for byte from files of its
own, and a tiny run crawls all of it with each scheduler (no timing is asserted)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from scrapy_ha.demo import harness
from scrapy_ha.demo.site import Catalogue

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import static_bench  # noqa: E402
import static_site  # noqa: E402
from static_spider import middle_rate  # noqa: E402

pytestmark = pytest.mark.skipif(
    shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists(),
    reason="nginx is not installed (apt-get install nginx-light)",
)
#: ``--quick``: 3 list pages of 20 items and the home page.
QUICK_PAGES = 3 * 21 + 1


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def test_nginx_serves_the_demo_catalogue(tmp_path):
    demo = Catalogue(3, 20, 0.0, 1)
    with static_site.StaticSite(tmp_path, pages=3) as site:
        assert site.total == QUICK_PAGES
        for path in ("/", "/list/1", "/list/3", "/item/1", "/item/60"):
            assert _get(site.url + path) == demo.page(path), path
        assert _get(site.url + "/item/61")[0] == 404  # no page the demo site lacks
        assert site.cpu_seconds() >= 0
        pid = site.proc.pid
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # stopped and reaped
    conf = (tmp_path / "nginx.conf").read_text()
    paths = [word.rstrip(";") for word in conf.split() if word.startswith("/")]
    assert paths and all(p.startswith(str(tmp_path)) for p in paths), paths


def test_middle_rate_leaves_out_start_and_end():
    # a slow start and a slow end; 2 responses a second in between
    times = [0.0, 10.0] + [10.0 + 0.5 * i for i in range(1, 7)] + [40.0, 90.0]
    assert middle_rate(times) == pytest.approx(2.0)
    assert middle_rate([1.0, 2.0]) == 0.0


def test_ratios_are_to_scrapys_scheduler_and_medians_of_the_rounds_pairs():
    def run(wall: float, cpu: float, outside: float) -> dict:
        return {"wall": wall, "cpu": cpu, "rate": 100.0, "outside": outside, "nginx_cpu": 0.1}

    extra = dict.fromkeys(static_bench.EXTRA_MEDIANS[2:], 0.0)
    runs = {
        "memory-freeze-tick": [{**run(5.0, 5.0, 0.5), **extra}, {**run(6.0, 6.0, 0.5), **extra}],
        "scrapy-ha": [{**run(5.5, 5.5, 0.8), **extra}, {**run(6.6, 6.0, 0.6), **extra}],
    }
    summary = static_bench.summarise(runs)
    assert summary["base"] == "memory-freeze-tick"  # no "memory" in the series
    pairs = summary["pair_ratio"]["scrapy-ha"]
    assert pairs["wall"] == pytest.approx(1.1) and pairs["cpu"] == pytest.approx(1.05)
    assert summary["ratio"]["scrapy-ha"]["wall"] == pytest.approx(6.05 / 5.5)
    assert summary["median"]["scrapy-ha"]["outside"] == pytest.approx(0.7)
    text = static_bench.table({"loopback": summary})
    assert "| loopback | scrapy-ha | 6.05 | 1.100x | 5.75 | 1.050x |" in text
    assert "| 0.70 |" in text and "to memory-freeze-tick, the median of the rounds' pairs" in text
    assert static_bench.base_of(["scrapy-ha", "memory", "memory-tick"]) == "memory"
    assert static_bench.base_of(["scrapy-ha"]) is None


def test_static_bench_quick(tmp_path):
    out, chart, log = tmp_path / "static.json", tmp_path / "static.png", tmp_path / "bench.out"
    command = [sys.executable, str(ROOT / "bench" / "run.py"), "--site", "static", "--quick"]
    schedulers = "memory,scrapy-ha-idle0,scrapy-ha-addon"  # the add-on as the README sets it up
    command += ["--schedulers", schedulers, "--out", str(out), "--chart", str(chart)]
    with log.open("wb") as stdout:
        proc = harness.spawn(command, stdout=stdout, stderr=subprocess.STDOUT)
    try:
        code = proc.wait(600)
    finally:
        harness.stop(proc)  # Redis, nginx and a crawl too, if it overran
    assert code == 0, log.read_text()[-3000:]
    results = json.loads(out.read_text())
    for placement in ("loopback", "latency"):
        runs = results[placement]["runs"]
        assert set(runs) == {"memory", "scrapy-ha-idle0", "scrapy-ha-addon"}
        for name, (run,) in runs.items():
            assert run["pages"] == QUICK_PAGES, (placement, name, run)
            assert run["wall"] > 0 and run["cpu"] > 0 and run["nginx_cpu"] >= 0
            assert run["user"] + run["sys"] == pytest.approx(run["cpu"])
            assert run["max_rss_kb"] > 0 and run["involuntary_switches"] >= 0
        assert results[placement]["ratio"]["memory"]["wall"] == 1.0
    assert results["latency"]["rtt_ms"] == 2.4
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None
    assert chart.exists() == has_matplotlib
    if has_matplotlib:
        assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_profile_summary_counts_scrapy_ha_inclusively(tmp_path):
    import cpu_profile

    ha, rp = "/v/site-packages/scrapy_ha/scheduler/shell.py", "/v/site-packages/redis/client.py"
    loop = "_run_once (/py/asyncio/base_events.py:1)"
    raw = tmp_path / "raw.txt"
    raw.write_text(
        f"{loop};_round ({ha}:10);execute ({rp}:5) 6\n"  # the background loop in redis-py
        f"{loop};next_request ({ha}:20) 2\n"
        f"{loop};parse (/v/site-packages/scrapy/http.py:3) 10\n"
        "<module> (run.py:1);_find_and_load (<frozen importlib._bootstrap>:1) 2\n"
    )
    summary = cpu_profile.analyse(raw, pages=1000)
    assert summary["samples"] == 20 and summary["samples_per_1000_pages"] == 20
    assert summary["start_up_pct"] == 10.0
    assert summary["under_pct"] == {"scrapy_ha": 40.0, "redis": 30.0}
    assert summary["innermost_package_pct"] == {"scrapy": 50.0, "redis-py": 30.0, "scrapy-ha": 10.0}
    assert summary["functions_inclusive_pct"] == {
        "_round (scrapy_ha/scheduler/shell.py)": 30.0,
        "execute (redis/client.py)": 30.0,
        "next_request (scrapy_ha/scheduler/shell.py)": 10.0,
    }


#: The end of cachegrind's report on stderr (valgrind 3.19, ``--cache-sim=yes --branch-sim=yes``).
CACHEGRIND_SUMMARY = """\
==7626== I   refs:      39,360,841
==7626== I1  misses:       145,062
==7626== LLi misses:        11,448
==7626== I1  miss rate:       0.37%
==7626==
==7626== D   refs:      16,403,296  (10,949,168 rd   + 5,454,128 wr)
==7626== D1  misses:       543,793  (   483,286 rd   +    60,507 wr)
==7626== LLd misses:        58,666  (    22,020 rd   +    36,646 wr)
==7626== LL refs:          688,855  (   628,348 rd   +    60,507 wr)
==7626== Branches:       7,034,131  ( 6,142,513 cond +   891,618 ind)
==7626== Mispredicts:      609,223  (   398,615 cond +   210,608 ind)
==7626== Mispred rate:         8.7% (       6.5%     +      23.6%   )
"""


def test_crawl_instructions_reads_cachegrinds_totals():
    import crawl_instructions

    assert crawl_instructions.cache_events("--7626-- warning: L3\n" + CACHEGRIND_SUMMARY) == {
        "instructions": 39_360_841,
        "i1_misses": 145_062,
        "lli_misses": 11_448,
        "data_refs": 16_403_296,
        "d1_misses": 543_793,
        "lld_misses": 58_666,
        "mispredicts": 609_223,
    }


def test_crawl_instructions_counts_a_page_between_two_sizes():
    import crawl_instructions

    def run(pages: int, per_page: int, fixed: int, misses: int) -> dict[str, int]:
        return {"instructions": fixed + per_page * pages, "lld_misses": misses, "pages": pages}

    counts = {
        "a": [run(100, 1000, 50_000, 7), run(300, 1000, 50_000, 7)],
        "b": [run(100, 1100, 60_000, 7), run(300, 1100, 60_000, 27)],
    }
    summary = crawl_instructions.summarise(counts, ["a", "b"])
    assert summary["a"]["per_page"] == 1000 and summary["a"]["fixed"] == 50_000
    assert summary["b"]["per_page_ratio"] == 1.1 and summary["b"]["fixed_ratio"] == 1.2
    assert summary["b"]["lld_misses_per_page"] == 0  # 20 over 200 pages rounds to 0
    assert summary["a"]["lld_misses_ratio"] is None  # none a page: no ratio
