"""The static-site crawl counted in instructions: a scheduler's whole-process cost, like for
like, on a machine too noisy for CPU seconds to tell 5% apart.

``python bench/crawl_instructions.py --pages 20,60 --schedulers memory-freeze-tick,scrapy-ha``
crawls the static site (``static_site.py``, Redis on loopback) once per size and scheduler,
each crawl a whole ``scrapy runspider`` process under valgrind's callgrind (needs
``valgrind``), and prints the instructions each process ran. Between two sizes the
difference per page is the steady-state cost of a page (start-up and close cancel out); the
smaller size's count less its pages at that rate is the fixed cost. Ratios are to the first
scheduler named. A crawl under callgrind runs some 50 times slower while nginx and Redis do
not, so Redis looks about 50 times nearer than on loopback: a scheduler that waits on Redis
is measured at its cheapest round trips, not its most batched rounds. The count moves by a
fraction of a percent between runs, whatever else the machine runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
import static_bench  # noqa: E402
import static_site  # noqa: E402

from scrapy_ha.demo import harness  # noqa: E402

#: Seconds one crawl may take under callgrind (about 50 times its time without).
TIMEOUT = 3600.0


def count(name: str, site: static_site.StaticSite, port: int, workdir: Path) -> dict[str, Any]:
    """One crawl of *site* with scheduler *name* under callgrind: its instructions and pages."""
    import redis

    redis.Redis(port=port).flushall()
    out = workdir / f"{name}.json"
    out.unlink(missing_ok=True)
    settings = static_bench.crawl_settings(name, port, 32, out)
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    command += static_bench.crawl_command(site.url, settings)
    os.environ["PYTHONHASHSEED"] = "0"
    static_bench.run_timed(command, workdir, timeout=TIMEOUT)
    log = (workdir / "crawl.log").read_text(errors="replace")
    collected = re.search(r"Collected : (\d+)", log)
    if collected is None:
        raise RuntimeError(f"no instruction count from callgrind:\n{log[-2000:]}")
    return {"instructions": int(collected.group(1)), "pages": json.loads(out.read_text())["pages"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", default="20,60", help="two sizes, list pages (x20 items)")
    parser.add_argument("--schedulers", default="memory-freeze-tick,scrapy-ha")
    args = parser.parse_args(argv)
    sizes = [int(p) for p in args.pages.split(",")]
    names = [s for s in args.schedulers.split(",") if s]
    if len(sizes) != 2 or sizes[0] >= sizes[1]:
        parser.error(f"--pages {args.pages!r}: give two sizes, the smaller first")
    unknown = [s for s in names if s not in static_bench.SCHEDULERS]
    if unknown:
        parser.error(f"--schedulers: unknown {unknown}")
    workdir = Path(tempfile.mkdtemp(prefix="scrapy-ha-instr-"))
    procs: list[Any] = []
    counts: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    try:
        redis_proc, port = harness.start_redis(workdir / "redis", args=["--appendonly", "no"])
        procs.append(redis_proc)
        for size in sizes:
            site = static_site.StaticSite(workdir / f"nginx-{size}", size)
            site.start()
            try:
                for name in names:
                    result = count(name, site, port, workdir)
                    counts[name].append(result)
                    print(
                        f"  {name:<20} {result['pages']:>6} pages  "
                        f"{result['instructions']:>16,} instructions",
                        flush=True,
                    )
            finally:
                site.stop()
    finally:
        for proc in procs:
            harness.stop(proc)
        shutil.rmtree(workdir, ignore_errors=True)
    summary: dict[str, Any] = {}
    for name, (small, large) in counts.items():
        per_page = (large["instructions"] - small["instructions"]) / (
            large["pages"] - small["pages"]
        )
        summary[name] = {
            "runs": [small, large],
            "per_page": round(per_page),
            "fixed": round(small["instructions"] - per_page * small["pages"]),
        }
    base = summary[names[0]]
    for name in names:
        summary[name]["per_page_ratio"] = round(summary[name]["per_page"] / base["per_page"], 4)
        summary[name]["fixed_ratio"] = round(summary[name]["fixed"] / base["fixed"], 4)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
