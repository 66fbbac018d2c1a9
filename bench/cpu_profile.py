"""Where a worker's CPU goes during the static-site crawl: py-spy samples whole ``scrapy
runspider`` processes, one per scheduler, and this sums the samples by package and by
function.

``python bench/cpu_profile.py --pages 200 --schedulers memory,scrapy-ha-idle0`` (``pip install
py-spy``) writes each process's collapsed stacks to ``--out-dir/<scheduler>.txt`` (py-spy's raw
format: open them in speedscope or flamegraph.pl) and prints, as JSON, for each scheduler:
its samples per 1,000 pages, the share of samples by the package of the innermost frame, and
the functions of scrapy-ha and redis-py with their inclusive share of all samples.
``--analyse FILE...`` summarises files written before.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
import static_bench  # noqa: E402
import static_site  # noqa: E402

from scrapy_ha.demo import harness  # noqa: E402

#: Samples per second: enough for ~1% resolution on a 20 s crawl, little overhead.
SAMPLE_RATE = 250
#: A frame of py-spy's raw output: ``function (file:line)``.
FRAME = re.compile(r"^(?P<func>.*) \((?P<file>.*):(?P<line>\d+)\)$")
#: Packages a sample's innermost frame is counted under, first match wins (path fragments).
PACKAGES = (
    ("scrapy-ha", "/scrapy_ha/"),
    ("redis-py", "/redis/"),
    ("hiredis", "hiredis"),
    ("scrapy", "/scrapy/"),
    ("twisted", "/twisted/"),
    ("parsel/lxml/cssselect", "/parsel/"),
    ("parsel/lxml/cssselect", "/lxml/"),
    ("parsel/lxml/cssselect", "/cssselect/"),
    ("w3lib", "/w3lib/"),
    ("asyncio", "/asyncio/"),
    ("json", "/json/"),
)
#: Functions whose inclusive share is reported: scrapy-ha's own and redis-py's.
REPORTED = ("/scrapy_ha/", "/redis/")
#: How many functions the summary lists.
TOP = 25


def package(path: str) -> str:
    return next((name for name, fragment in PACKAGES if fragment in path), "other")


def parse(path: Path) -> list[tuple[list[tuple[str, str]], int]]:
    """py-spy's raw output: each stack (outermost frame first) as (function, file), with
    its number of samples."""
    stacks = []
    for line in path.read_text().splitlines():
        text, _, count = line.rpartition(" ")
        if not text or not count.isdigit():
            continue
        frames = []
        for frame in text.split(";"):
            match = FRAME.match(frame)
            if match:
                frames.append((match["func"], match["file"]))
        stacks.append((frames, int(count)))
    return stacks


def analyse(path: Path, pages: int = 0) -> dict[str, Any]:
    """The samples of one profile, by package of the innermost frame and by function."""
    stacks = parse(path)
    total = sum(count for _, count in stacks)
    start_up = sum(count for frames, count in stacks if _importing(frames))
    crawl = [(frames, count) for frames, count in stacks if not _importing(frames)]
    leaf: Counter[str] = Counter()
    leaf_function: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    under: Counter[str] = Counter()  # samples with a frame of scrapy-ha / redis-py anywhere
    for frames, count in crawl:
        if frames:
            leaf[package(frames[-1][1])] += count
            leaf_function[f"{frames[-1][0]} ({Path(frames[-1][1]).name})"] += count
        seen = {f"{func} ({_short(file)})" for func, file in frames if _reported(file)}
        for name in seen:
            inclusive[name] += count
        for fragment in {
            fragment for _, file in frames for fragment in REPORTED if fragment in file
        }:
            under[fragment.strip("/")] += count

    def pct(counter: Counter[str], top: int | None = None) -> dict[str, float]:
        return {name: round(100 * n / total, 2) for name, n in counter.most_common(top)}

    return {
        "samples": total,
        "samples_per_1000_pages": round(1000 * total / pages, 1) if pages else None,
        "start_up_pct": round(100 * start_up / total, 2) if total else 0.0,
        "under_pct": pct(under),
        "innermost_package_pct": pct(leaf),
        "innermost_function_pct": pct(leaf_function, TOP),
        "functions_inclusive_pct": pct(inclusive, TOP),
    }


def _importing(frames: list[tuple[str, str]]) -> bool:
    return any(func == "_find_and_load" for func, _ in frames)


def _reported(file: str) -> bool:
    return any(fragment in file for fragment in REPORTED)


def _short(file: str) -> str:
    for fragment in REPORTED:
        if fragment in file:
            return fragment.strip("/") + "/" + file.rsplit(fragment, 1)[1]
    return file


def profile(name: str, site: static_site.StaticSite, redis_port: int, args: Any) -> Path:
    """Crawl *site* with the scheduler *name* under py-spy; the path of its samples."""
    import redis

    redis.Redis(port=redis_port).flushall()
    raw: Path = args.out_dir / f"{name}.txt"
    out = args.workdir / f"{name}.json"
    settings = static_bench.crawl_settings(name, redis_port, args.concurrency, out)
    command = [_py_spy(), "record", "--nonblocking"]
    command += ["--rate", str(args.rate), "--format", "raw", "--full-filenames", "-o", str(raw)]
    command += ["--", *static_bench.crawl_command(site.url, settings)]
    timed = static_bench.run_timed(command, args.workdir)
    pages = json.loads(out.read_text())["pages"]
    print(f"  {name}: {pages} pages, {timed['wall']:.1f} s, cpu {timed['cpu']:.2f} s", flush=True)
    return raw


def _py_spy() -> str:
    """py-spy next to this Python (the ``bench`` extra), else the first on ``PATH``."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy") or str(beside)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=200, help="list pages (x20 items)")
    parser.add_argument("--schedulers", default="memory,scrapy-ha-idle0")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--delay-ms", type=float, default=0.0, help="Redis this far, one way")
    parser.add_argument("--rate", type=int, default=SAMPLE_RATE, help="samples per second")
    parser.add_argument("--out-dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--analyse", nargs="*", type=Path, help="summarise these files only")
    args = parser.parse_args(argv)
    if args.analyse:
        print(json.dumps({str(p): analyse(p) for p in args.analyse}, indent=1))
        return 0
    args.out_dir.mkdir(parents=True, exist_ok=True)
    procs: list[Any] = []
    with harness.work_dir("scrapy-ha-profile-") as args.workdir:  # the profiles: --out-dir
        try:
            with static_site.StaticSite(args.workdir / "nginx", args.pages) as site:
                redis_dir = args.workdir / "redis"
                proc, port = harness.start_redis(redis_dir, args=["--appendonly", "no"])
                procs.append(proc)
                if args.delay_ms:
                    port = static_bench.delay_line(port, args.delay_ms, procs)
                summary = {}
                for name in args.schedulers.split(","):
                    summary[name] = analyse(profile(name, site, port, args), site.total)
                print(json.dumps(summary, indent=1))
        finally:
            for proc in procs:
                harness.stop(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
