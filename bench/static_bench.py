"""The static-site benchmark: what a scheduler costs when the site is never the limit.

``python bench/run.py --site static`` (or ``python bench/static_bench.py``) writes the demo
catalogue to disk (500 list pages of 20 items in one pagination chain, 10,501 pages), serves
it with nginx (`static_site.py`), starts its own redis-server and a delay line in front of
it, and crawls the site with each scheduler in turn, whole ``scrapy runspider`` processes,
``--runs`` rounds (the order reversed every other round), first with Redis on loopback, then
``2 x --delay-ms`` away. For each crawl it records the wall time from start to exit, the
worker's CPU (user + system, from ``wait4``), the pages/s in the middle of the crawl and
nginx's CPU, and the wall time outside the crawl (before its first response and after its
last: start-up and close); it prints medians and their ratios to Scrapy's scheduler of the
same series (``memory``, else the first ``memory-*`` in it, as ``memory-freeze-tick``: the
like-for-like baseline), each the median of the rounds' pairs, writes everything as JSON to
``--out`` and, with matplotlib installed, a chart to ``--chart``.
"""

from __future__ import annotations

import argparse
import compileall
import functools
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
import latency_proxy  # noqa: E402
import static_site  # noqa: E402

from scrapy_ha.demo import harness  # noqa: E402

#: Seconds one crawl may take before the benchmark stops it (the full site takes ~20 s here).
CRAWL_TIMEOUT = 900
#: The schedulers a series compares, by name: the settings each crawl gets.
SCHEDULERS: dict[str, dict[str, str]] = {
    "memory": {"SCHEDULER": "scrapy.core.scheduler.Scheduler"},
    "scrapy-ha": {"SCHEDULER": "scrapy_ha.Scheduler"},
    "scrapy-ha-idle0": {"SCHEDULER": "scrapy_ha.Scheduler", "HA_IDLE_TIMEOUT": "0"},
    # what the garbage collector costs (see static_spider.py): Scrapy's scheduler with the
    # start-up heap frozen as scrapy-ha freezes it (HA_GC_FREEZE), scrapy-ha without, and
    # both with the reactor's cancelled timers dropped every second
    "memory-freeze": {"SCHEDULER": "scrapy.core.scheduler.Scheduler", "BENCH_GC_FREEZE": "1"},
    "scrapy-ha-nofreeze": {"SCHEDULER": "scrapy_ha.Scheduler", "HA_GC_FREEZE": "False"},
    "memory-tick": {"SCHEDULER": "scrapy.core.scheduler.Scheduler", "BENCH_TWISTED_TICK": "1"},
    "scrapy-ha-tick": {"SCHEDULER": "scrapy_ha.Scheduler", "BENCH_TWISTED_TICK": "1"},
    # like for like: Scrapy's scheduler given both, scrapy-ha given neither
    "memory-freeze-tick": {
        "SCHEDULER": "scrapy.core.scheduler.Scheduler",
        "BENCH_GC_FREEZE": "1",
        "BENCH_TWISTED_TICK": "1",
    },
    "scrapy-ha-bare": {
        "SCHEDULER": "scrapy_ha.Scheduler",
        "HA_GC_FREEZE": "False",
        "HA_TIMER_SWEEP": "0",
    },
    # a GET downloads while the round that stores it is on its way (the default now; set
    # here as it was measured when it was not)
    "scrapy-ha-early": {"SCHEDULER": "scrapy_ha.Scheduler", "HA_EARLY_DOWNLOAD": "True"},
    # as the README sets it up: the add-on (the scheduler, its retry, proxy, checkpoint and
    # parent-lease middlewares): what a user of the add-on gets, middlewares included
    "scrapy-ha-addon": {"ADDONS": '{"scrapy_ha.Addon": 0}'},
    # a page's items committed to the item stream with its ack (HA_ITEMS, off by default)
    "scrapy-ha-items": {"SCHEDULER": "scrapy_ha.Scheduler", "HA_ITEMS": "outbox"},
    "scrapy-redis": {
        "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
        "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
    },
}
#: The default series: scrapy-redis is left out because at 2.4 ms it takes minutes per run
#: (every next_request is a blocking round trip); add it with --schedulers.
DEFAULT_SCHEDULERS = "memory,scrapy-ha,scrapy-ha-idle0"
#: Settings every crawl gets: the worker's work is fetching and parsing, nothing else.
COMMON_SETTINGS = {
    "LOG_LEVEL": "WARNING",
    "TELNETCONSOLE_ENABLED": "False",
    "REMOTE_CONTROL_ENABLED": "False",
}
#: The measures of a crawl that get medians and ratios.
MEASURES = ("wall", "cpu", "rate")
#: Measures that get a median only.
EXTRA_MEDIANS = (
    "outside",
    "nginx_cpu",
    "nginx_core_at_1000",
    "gc_cpu",
    "redis_commands_per_page",
    "redis_scripts_per_page",
)
#: Commands that run a Lua script: one round trip each (scrapy-ha's batches).
SCRIPT_CALLS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall")


def crawl_settings(name: str, redis_port: int, concurrency: int, out: Path) -> dict[str, str]:
    return {
        **SCHEDULERS[name],
        **COMMON_SETTINGS,
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "CONCURRENT_REQUESTS": str(concurrency),
        "CONCURRENT_REQUESTS_PER_DOMAIN": str(concurrency),
        "BENCH_OUT": str(out),
    }


def crawl_command(site: str, settings: dict[str, str]) -> list[str]:
    args = [sys.executable, "-m", "scrapy.cmdline", "runspider"]
    args += [str(BENCH / "static_spider.py"), "-a", f"base_url={site}"]
    for key, value in settings.items():
        args += ["-s", f"{key}={value}"]
    return args


@functools.cache
def compile_package() -> None:
    """Compile scrapy-ha's modules to bytecode once, before any crawl is timed: pip compiles
    an installed package (Scrapy's modules here have theirs), but a tree run from source
    with ``PYTHONDONTWRITEBYTECODE`` set (as this machine's environment sets it) has none,
    and every crawl would compile some hundred modules again (about 0.3 s of CPU charged to
    scrapy-ha alone)."""
    compileall.compile_dir(str(ROOT / "scrapy_ha"), quiet=1)


def run_timed(args: list[str], cwd: Path, timeout: float = CRAWL_TIMEOUT) -> dict[str, float]:
    """Run *args* to its end; its wall time and its own CPU time (user + system)."""
    compile_package()
    started = time.monotonic()
    proc = harness.spawn(
        args,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=(cwd / "crawl.log").open("wb"),
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    timer = threading.Timer(timeout, harness.signal_group, (proc, signal.SIGKILL))
    timer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:  # interrupted (SIGTERM, Ctrl-C): the crawl goes too
        harness.stop(proc)
        raise
    finally:
        timer.cancel()
    wall = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    harness.stop(proc)  # closes its log; the process is reaped already
    if proc.returncode != 0:
        log = (cwd / "crawl.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"crawl exited with {proc.returncode}: {args}\n{log}")
    return {
        "wall": wall,
        "cpu": usage.ru_utime + usage.ru_stime,
        # the split, and what can make the same instructions cost more time: the process
        # made to wait (involuntary switches: another process took its core, and its caches)
        "user": usage.ru_utime,
        "sys": usage.ru_stime,
        "voluntary_switches": usage.ru_nvcsw,
        "involuntary_switches": usage.ru_nivcsw,
        "minor_faults": usage.ru_minflt,
        "max_rss_kb": usage.ru_maxrss,
    }


def crawl(name: str, site: static_site.StaticSite, redis_port: int, args: Any) -> dict[str, Any]:
    import redis

    client = redis.Redis(port=redis_port)
    client.flushall()
    client.config_resetstat()
    out = args.workdir / f"{name}.json"
    out.unlink(missing_ok=True)
    command = crawl_command(site.url, crawl_settings(name, redis_port, args.concurrency, out))
    nginx_before = site.cpu_seconds()
    timed = run_timed(command, args.workdir)
    nginx = site.cpu_seconds() - nginx_before
    result = json.loads(out.read_text())
    calls = redis_calls(client)
    return {
        "redis_calls": calls,
        # Redis's work (commands run inside scripts count too) and the scripts called
        "redis_commands_per_page": sum(calls.values()) / max(1, result["pages"]),
        "redis_scripts_per_page": sum(calls.get(c, 0) for c in SCRIPT_CALLS)
        / max(1, result["pages"]),
        **timed,
        "rate": result["middle_rate"],
        # first to last response: the rest of the wall time is start-up and close
        "crawl_seconds": result["seconds"],
        "outside": timed["wall"] - result["seconds"],
        "pages": result["pages"],
        "nginx_cpu": nginx,
        "gc_cpu": result["gc"]["seconds"],
        "gc_collections": result["gc"]["collections"],
        "gc_by_generation": result["gc"]["seconds_by_generation"],
        "heap": result["heap"],
        # nginx's share of a core had it served 1,000 pages/s: its CPU per 1,000 pages
        "nginx_core_at_1000": nginx / result["pages"] * 1000 if result["pages"] else 0.0,
    }


def redis_calls(client: Any) -> dict[str, int]:
    """Commands Redis ran for the crawl, by name (``INFO commandstats``, reset before it;
    the commands a Lua script runs are counted too)."""
    stats = client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): int(value["calls"])
        for name, value in stats.items()
        if name not in ("cmdstat_flushall", "cmdstat_config|resetstat", "cmdstat_info")
    }


def order(names: list[str], run: int) -> list[str]:
    """Every other round in reverse, so no scheduler always runs first or after another."""
    return names if run % 2 == 0 else names[::-1]


def series(args: Any, site: static_site.StaticSite, redis_port: int, label: str) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in args.schedulers}
    for run in range(args.runs):
        for name in order(args.schedulers, run):
            result = crawl(name, site, redis_port, args)
            runs[name].append(result)
            print(
                f"  [{label}] run {run + 1} {name:<16} wall {result['wall']:6.2f} s  "
                f"cpu {result['cpu']:6.2f} s (gc {result['gc_cpu']:5.2f} s, "
                f"{result['involuntary_switches']} preempted)  "
                f"{result['rate']:7.1f} pages/s  "
                f"({result['pages']} pages, nginx {result['nginx_cpu']:.2f} s cpu, "
                f"Redis: {result['redis_commands_per_page']:.2f} commands, "
                f"{result['redis_scripts_per_page']:.3f} scripts per page)",
                flush=True,
            )
    return summarise(runs)


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians per scheduler, and ratios to the base (:func:`base_of`): of the medians
    (``ratio``), and the median of each round's pair (``pair_ratio``: the rounds alternate
    the order, so a pair ran side by side)."""
    median = {
        name: {
            m: statistics.median(r[m] for r in results if m in r)
            for m in (*MEASURES, *EXTRA_MEDIANS)
            if any(m in r for r in results)
        }
        for name, results in runs.items()
    }
    base = base_of(list(runs))
    if base is None:
        return {"runs": runs, "median": median, "ratio": {}, "pair_ratio": {}, "base": None}
    ratio = {
        name: {m: med[m] / median[base][m] for m in MEASURES if median[base][m]}
        for name, med in median.items()
    }
    pair_ratio = {
        name: {
            m: statistics.median(r[m] / b[m] for r, b in zip(results, runs[base], strict=False))
            for m in MEASURES
            if all(b[m] for b in runs[base])
        }
        for name, results in runs.items()
    }
    return {
        "runs": runs,
        "median": median,
        "ratio": ratio,
        "pair_ratio": pair_ratio,
        "base": base,
    }


def base_of(names: list[str]) -> str | None:
    """The scheduler the others are compared with: Scrapy's own with its defaults
    (``memory``) when the series has it, else the first of Scrapy's in the series (the
    issue's like for like, ``memory-freeze-tick``), else none."""
    if "memory" in names:
        return "memory"
    return next((name for name in names if name.startswith("memory")), None)


def machine() -> dict[str, Any]:
    import redis
    import scrapy

    def version(*command: str) -> str:
        done = subprocess.run(command, capture_output=True, text=True)
        return (done.stdout + done.stderr).strip()

    return {
        "cpus": os.cpu_count(),
        "load": os.getloadavg(),
        "python": platform.python_version(),
        "scrapy": scrapy.__version__,
        "redis_py": redis.__version__,
        "hiredis": _hiredis_version(),
        "redis_server": version("redis-server", "--version"),
        "nginx": version(static_site.nginx_binary(), "-v"),
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def _hiredis_version() -> str | None:
    """hiredis's version if it is installed (redis-py then parses replies with it)."""
    try:
        return importlib.metadata.version("hiredis")
    except importlib.metadata.PackageNotFoundError:
        return None


def table(results: dict[str, Any]) -> str:
    """The medians, and the ratios to the base as medians of the rounds' pairs, as a
    Markdown table; "outside" is the wall time before the first response and after the
    last (start-up and close)."""
    lines = [
        "| Redis | scheduler | wall s | wall ratio | worker CPU s | CPU ratio "
        "| pages/s (middle) | rate ratio | outside the crawl s | nginx CPU s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    bases = set()
    for placement in ("loopback", "latency"):
        if placement not in results:
            continue
        part = results[placement]
        bases.add(part.get("base") or "memory")
        where = "loopback" if placement == "loopback" else _rtt_label(part)
        ratios = part.get("pair_ratio") or part["ratio"]  # results of before the pairs
        for name, med in part["median"].items():
            ratio = ratios.get(name, {})
            outside = f"{med['outside']:.2f}" if "outside" in med else "-"
            lines.append(
                f"| {where} | {name} | {med['wall']:.2f} | {ratio.get('wall', 0):.3f}x "
                f"| {med['cpu']:.2f} | {ratio.get('cpu', 0):.3f}x | {med['rate']:.0f} "
                f"| {ratio.get('rate', 0):.3f} | {outside} | {med['nginx_cpu']:.2f} |"
            )
    lines.append(f"\nRatios: to {', '.join(sorted(bases))}, the median of the rounds' pairs.")
    return "\n".join(lines)


def _rtt_label(part: dict[str, Any]) -> str:
    """The round trip to Redis a series ran at: as measured through the delay line when it
    was (older results have only the figure asked for)."""
    if "rtt_measured_ms" in part:
        return f"{part['rtt_measured_ms']:.2f} ms RTT"
    return f"{part['rtt_ms']:g} ms RTT"


def chart(results: dict[str, Any], path: Path) -> bool:
    """A PNG of pages/s and worker CPU per scheduler for each Redis placement; False
    without matplotlib (``pip install matplotlib``, or the ``bench`` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    placements = [p for p in ("loopback", "latency") if p in results]
    names = list(results[placements[0]]["median"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.8 / len(placements)
    for i, placement in enumerate(placements):
        part = results[placement]
        label = "Redis on loopback" if placement == "loopback" else "Redis " + _rtt_label(part)
        xs = [n + i * width for n in range(len(names))]
        for ax, measure in zip(axes, ("rate", "cpu"), strict=True):
            values = [part["median"][name][measure] for name in names]
            bars = ax.bar(xs, values, width, label=label)
            ax.bar_label(bars, fmt="%.0f" if measure == "rate" else "%.1f", fontsize=7)
    titles = ("pages/s in the middle of the crawl", "worker CPU s, start to exit")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title, fontsize=10)
        ax.set_xticks([n + width * (len(placements) - 1) / 2 for n in range(len(names))])
        ax.set_xticklabels(names, fontsize=8)
    axes[0].legend(fontsize=8)
    pages = results[placements[0]]["runs"][names[0]][0]["pages"]
    fig.suptitle(f"Static site (nginx), {pages} pages, medians of {results['runs']} rounds")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=500, help="list pages (x20 items)")
    parser.add_argument("--runs", type=int, default=3, help="rounds of every scheduler")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--delay-ms", type=float, default=1.2, help="one way (2.4 ms RTT)")
    parser.add_argument("--schedulers", default=DEFAULT_SCHEDULERS, help=", ".join(SCHEDULERS))
    parser.add_argument("--only", choices=["loopback", "latency"], help="one Redis placement only")
    parser.add_argument("--out", type=Path, default=BENCH / "results-static.json")
    parser.add_argument("--chart", type=Path, default=ROOT / "docs" / "benchmarks-static.png")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 3 list pages, 1 round")
    args = parser.parse_args(argv)
    args.schedulers = [s for s in args.schedulers.split(",") if s]
    unknown = [s for s in args.schedulers if s not in SCHEDULERS]
    if unknown:
        parser.error(f"--schedulers: unknown {unknown}; choose from {', '.join(SCHEDULERS)}")
    if args.quick:
        args.pages, args.runs = 3, 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.workdir = Path(tempfile.mkdtemp(prefix="scrapy-ha-static-"))
    procs: list[Any] = []
    site = static_site.StaticSite(args.workdir / "nginx", args.pages)
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)  # `finally` stops everything
    try:
        site.start()
        return run(args, site, procs)
    finally:
        signal.signal(signal.SIGTERM, previous)
        for proc in procs:
            harness.stop(proc)
        site.stop()
        shutil.rmtree(args.workdir, ignore_errors=True)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace, site: static_site.StaticSite, procs: list[Any]) -> int:
    redis_proc, redis_port = harness.start_redis(
        args.workdir / "redis", args=["--appendonly", "no"]
    )
    procs.append(redis_proc)
    results: dict[str, Any] = {"machine": machine(), "runs": args.runs, "pages": site.total}
    print(f"Static site: {site.total} pages at {site.url}, {args.runs} round(s)", flush=True)
    if args.only in (None, "loopback"):
        results["loopback"] = series(args, site, redis_port, "loopback")
    if args.only in (None, "latency"):
        delayed = delay_line(redis_port, args.delay_ms, procs)
        measured = latency_proxy.measured_rtt(delayed)
        print(f"  the delay line's round trip, measured: {measured:.2f} ms", flush=True)
        label = f"Redis {2 * args.delay_ms:g} ms away"
        results["latency"] = series(args, site, delayed, label)
        results["latency"]["rtt_ms"] = 2 * args.delay_ms
        results["latency"]["rtt_measured_ms"] = measured
    results["machine"]["load_after"] = os.getloadavg()
    args.out.write_text(json.dumps(results, indent=1))
    print("\n" + table(results))
    if chart(results, args.chart):
        print(f"chart: {args.chart}")
    return 0


def delay_line(redis_port: int, delay_ms: float, procs: list[Any]) -> int:
    script = str(BENCH / "latency_proxy.py")
    command = [sys.executable, script, "--to", str(redis_port), "--delay-ms", str(delay_ms)]
    proc = harness.spawn(command, stdout=subprocess.PIPE)
    procs.append(proc)
    return harness.read_listening(proc, "the delay line")[0]


if __name__ == "__main__":
    sys.exit(main())
