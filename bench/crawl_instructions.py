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

``--cache`` runs each crawl under cachegrind with its cache and branch simulation instead
(slower: 19 minutes for ``--pages 20,60`` here, against about 12) and prints, per page, the
simulated first-level and last-level cache misses and the mispredicted branches besides the
instructions: what can make one scheduler's instructions slower than another's when the
counts agree but the CPU seconds do not. The simulated caches are valgrind's model of this
machine's, not its own counters; ``--cache-ll BYTES`` sets the size of the last level it
simulates (valgrind takes the largest cache the machine reports, here a 480 MB L3 shared
with the host's other tenants, which no crawl misses: ``--cache-ll 2097152``, a core's 2 MB
L2, counts what leaves it).
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


#: cachegrind's summary lines (``==pid== D1  misses: 1,234 ...``) and the event each counts.
CACHE_EVENTS = {
    "I refs": "instructions",
    "I1 misses": "i1_misses",
    "LLi misses": "lli_misses",
    "D refs": "data_refs",
    "D1 misses": "d1_misses",
    "LLd misses": "lld_misses",
    "Mispredicts": "mispredicts",
}


def cache_events(log: str) -> dict[str, int]:
    """The totals of cachegrind's summary in *log*, by ``CACHE_EVENTS`` name."""
    found: dict[str, int] = {}
    for line in log.splitlines():
        match = re.match(r"==\d+== ([A-Za-z0-9 ]+?):\s+([\d,]+)", line)
        if match is None:
            continue
        label = " ".join(match.group(1).split())
        if label in CACHE_EVENTS:
            found[CACHE_EVENTS[label]] = int(match.group(2).replace(",", ""))
    return found


def count(
    name: str,
    site: static_site.StaticSite,
    port: int,
    workdir: Path,
    cache: bool = False,
    cache_ll: int = 0,
) -> dict[str, Any]:
    """One crawl of *site* with scheduler *name* under callgrind (or cachegrind with *cache*):
    its instructions (and simulated misses) and pages."""
    import redis

    redis.Redis(port=port).flushall()
    out = workdir / f"{name}.json"
    out.unlink(missing_ok=True)
    settings = static_bench.crawl_settings(name, port, 32, out)
    if cache:
        command = ["valgrind", "--tool=cachegrind", "--cache-sim=yes", "--branch-sim=yes"]
        command += ["--cachegrind-out-file=/dev/null"]
        if cache_ll:
            command += [f"--LL={cache_ll},16,64"]
    else:
        command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    command += static_bench.crawl_command(site.url, settings)
    os.environ["PYTHONHASHSEED"] = "0"
    static_bench.run_timed(command, workdir, timeout=TIMEOUT)
    log = (workdir / "crawl.log").read_text(errors="replace")
    pages = json.loads(out.read_text())["pages"]
    if cache:
        events = cache_events(log)
        if "instructions" not in events:
            raise RuntimeError(f"no summary from cachegrind:\n{log[-2000:]}")
        return {**events, "pages": pages}
    collected = re.search(r"Collected : (\d+)", log)
    if collected is None:
        raise RuntimeError(f"no instruction count from callgrind:\n{log[-2000:]}")
    return {"instructions": int(collected.group(1)), "pages": pages}


def summarise(counts: dict[str, list[dict[str, Any]]], names: list[str]) -> dict[str, Any]:
    """Per scheduler, from its two crawls (the smaller first): each event's count a page
    (the difference between the two over the pages between them), the fixed part of the
    instructions, and ratios to the first of *names*."""
    summary: dict[str, Any] = {}
    for name, (small, large) in counts.items():
        pages = large["pages"] - small["pages"]
        per_page = (large["instructions"] - small["instructions"]) / pages
        summary[name] = {
            "runs": [small, large],
            "per_page": round(per_page),
            "fixed": round(small["instructions"] - per_page * small["pages"]),
        }
        for event in small:
            if event not in ("pages", "instructions"):
                summary[name][f"{event}_per_page"] = round((large[event] - small[event]) / pages)
    base = summary[names[0]]
    for name in names:
        for key in [k for k in summary[name] if k == "per_page" or k.endswith("_per_page")]:
            label = "per_page_ratio" if key == "per_page" else key.replace("per_page", "ratio")
            # (None: the first scheduler had none of these a page, e.g. last-level misses)
            summary[name][label] = round(summary[name][key] / base[key], 4) if base[key] else None
        summary[name]["fixed_ratio"] = round(summary[name]["fixed"] / base["fixed"], 4)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", default="20,60", help="two sizes, list pages (x20 items)")
    parser.add_argument("--schedulers", default="memory-freeze-tick,scrapy-ha")
    parser.add_argument(
        "--cache", action="store_true", help="cachegrind: simulated cache misses and branches too"
    )
    parser.add_argument(
        "--cache-ll", type=int, default=0, help="with --cache: the simulated last level, bytes"
    )
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
                    result = count(name, site, port, workdir, args.cache, args.cache_ll)
                    counts[name].append(result)
                    events = "  ".join(
                        f"{value:,} {event}" for event, value in result.items() if event != "pages"
                    )
                    print(f"  {name:<20} {result['pages']:>6} pages  {events}", flush=True)
            finally:
                site.stop()
    finally:
        for proc in procs:
            harness.stop(proc)
        shutil.rmtree(workdir, ignore_errors=True)
    summary = summarise(counts, names)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
