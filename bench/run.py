"""Benchmarks: scrapy-ha against Scrapy's memory scheduler and scrapy-redis, side by side.

``python bench/run.py`` (``make bench``) starts its own redis-server, the demo catalogue
(10,501 pages by default) and, for the latency runs, a delay line in front of Redis; crawls
the site with (a) Scrapy's memory scheduler, (b) scrapy-redis, (c) scrapy-ha, in
alternation, ``--runs`` times each, with Redis on loopback and ``--delay-ms`` away; then runs
the queue micro-benchmark (``bench/queue_micro.py``). It prints medians and the ratios to
(a), and writes them as JSON to ``--out``. ``--quick`` is a smoke run on a tiny site.
``python bench/run.py --site static [options]`` runs the static-site benchmark instead
(``bench/static_bench.py``: nginx serves the catalogue; wall time and worker CPU per crawl).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import latency_proxy  # noqa: E402  (bench/ is sys.path[0] when this file runs as a script)

from scrapy_ha.demo import harness  # noqa: E402

#: Seconds one crawl may take before the benchmark gives up (the full site takes about 2 min).
CRAWL_TIMEOUT = 1800
SCHEDULERS: dict[str, dict[str, str]] = {
    "memory": {"SCHEDULER": "scrapy.core.scheduler.Scheduler"},
    "scrapy-redis": {
        "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
        "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
    },
    "scrapy-ha": {"SCHEDULER": "scrapy_ha.Scheduler", "HA_IDLE_TIMEOUT": "0"},
}


class Services:
    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.procs: list[subprocess.Popen[bytes]] = []

    def site(self, *args: str) -> str:
        """Start the demo catalogue with *args*; its base URL."""
        proc, url = harness.start_site(*args)
        self.procs.append(proc)
        return url

    def listen(self, args: list[str]) -> int:
        """Start a server that prints ``LISTENING <port>`` (the delay line); its port."""
        proc, ports = harness.start_listening(args)
        self.procs.append(proc)
        return ports[0]

    def redis(self) -> int:
        proc, port = harness.start_redis(self.dir / "redis", args=["--appendonly", "no"])
        self.procs.append(proc)
        return port

    def stop(self) -> None:
        for proc in self.procs:
            harness.stop(proc)


def crawl(name: str, site: str, redis_port: int, concurrency: int, workdir: Path) -> dict[str, Any]:
    import redis

    redis.Redis(port=redis_port).flushall()
    out = workdir / f"{name}.json"
    settings = {
        **SCHEDULERS[name],
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "CONCURRENT_REQUESTS": str(concurrency),
        "CONCURRENT_REQUESTS_PER_DOMAIN": str(concurrency),
        "LOG_LEVEL": "WARNING",
        "BENCH_OUT": str(out),
        "TELNETCONSOLE_ENABLED": "False",
        "REMOTE_CONTROL_ENABLED": "False",
    }
    args = [
        sys.executable,
        "-m",
        "scrapy.cmdline",
        "runspider",
        str(ROOT / "bench" / "spider.py"),
        "-a",
        f"base_url={site}",
    ]
    for key, value in settings.items():
        args += ["-s", f"{key}={value}"]
    subprocess.run(
        args,
        check=True,
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        timeout=CRAWL_TIMEOUT,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    result = json.loads(out.read_text())
    result["rate"] = result["pages"] / result["seconds"]
    return dict(result)


def crawl_series(
    args: argparse.Namespace, svc: Services, site: str, redis_port: int, label: str
) -> dict[str, Any]:
    rates: dict[str, list[float]] = {name: [] for name in SCHEDULERS}
    pages: dict[str, list[int]] = {name: [] for name in SCHEDULERS}
    for run in range(args.runs):
        for name in SCHEDULERS:
            result = crawl(name, site, redis_port, args.concurrency, svc.dir)
            rates[name].append(result["rate"])
            pages[name].append(result["pages"])
            print(
                f"  [{label}] run {run + 1} {name:<13} {result['rate']:7.1f} pages/s "
                f"({result['pages']} pages)",
                flush=True,
            )
    medians = {name: statistics.median(r) for name, r in rates.items()}
    base = medians["memory"]
    return {
        "pages": pages,
        "runs": rates,
        "median": medians,
        "ratio": {name: m / base for name, m in medians.items()},
    }


def main() -> int:
    if sys.argv[1:3] == ["--site", "static"]:  # nginx serves the catalogue: static_bench.py
        import static_bench  # bench/ is sys.path[0] when this file runs as a script

        return static_bench.main(sys.argv[3:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=500, help="list pages (×20 items)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--delay-ms", type=float, default=1.0, help="one way (2 ms round trip)")
    parser.add_argument(
        "--micro", type=int, default=100_000, help="requests in the micro-benchmark"
    )
    parser.add_argument("--memory-sizes", default="100000,1000000")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results.json")
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny and fast")
    parser.add_argument(
        "--only",
        choices=["loopback", "latency", "micro"],
        help="run one part only (its results are printed, not written)",
    )
    args = parser.parse_args()
    if args.quick:
        args.pages, args.runs, args.micro, args.memory_sizes = 5, 1, 2000, "2000"
    workdir = Path(tempfile.mkdtemp(prefix="scrapy-ha-bench-"))
    svc = Services(workdir)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # so that `finally` stops every process
    try:
        return run(args, svc)
    finally:
        svc.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace, svc: Services) -> int:
    redis_port = svc.redis()
    site = svc.site("--pages", str(args.pages), "--per-page", "20", "--chains", "10")
    delayed_port = svc.listen(
        [
            sys.executable,
            str(ROOT / "bench" / "latency_proxy.py"),
            "--to",
            str(redis_port),
            "--delay-ms",
            str(args.delay_ms),
        ]
    )
    results: dict[str, Any] = {"machine": machine()}
    print(f"Crawling {args.pages * 21 + 1} pages, {args.runs} run(s) per scheduler")
    if args.only in (None, "loopback"):
        results["loopback"] = crawl_series(args, svc, site, redis_port, "loopback")
    if args.only in (None, "latency"):
        measured = latency_proxy.measured_rtt(delayed_port)
        print(f"The delay line's round trip, measured: {measured:.2f} ms", flush=True)
        results["latency"] = crawl_series(
            args, svc, site, delayed_port, f"Redis {2 * args.delay_ms:g} ms away"
        )
        results["latency"]["rtt_ms"] = 2 * args.delay_ms
        results["latency"]["rtt_measured_ms"] = measured
    if args.only is not None and args.only != "micro":
        print(json.dumps({k: v for k, v in results.items() if k != "machine"}, indent=1))
        return 0
    micro = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "queue_micro.py"),
            "--redis-port",
            str(redis_port),
            "--n",
            str(args.micro),
            "--memory-sizes",
            args.memory_sizes,
            "--site",
            site,
        ],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    results["micro"] = json.loads(micro.stdout)
    if args.only == "micro":  # printed, not written, as for the other parts
        print(json.dumps(results["micro"], indent=1))
        return 0
    args.out.write_text(json.dumps(results, indent=2))
    report(results)
    return 0


def machine() -> dict[str, Any]:
    import redis
    import scrapy
    import scrapy_redis

    server = subprocess.run(
        [harness.redis_binary(), "--version"], capture_output=True, text=True
    ).stdout
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "scrapy": scrapy.__version__,
        "scrapy_redis": scrapy_redis.__version__,
        "redis_py": redis.__version__,
        "redis_server": server.split()[2].removeprefix("v="),
        "platform": platform.platform(),
    }


def report(results: dict[str, Any]) -> None:
    print(
        "\nscheduler       loopback pages/s  ratio   Redis {:g} ms away  ratio".format(
            results["latency"]["rtt_ms"]
        )
    )
    for name in SCHEDULERS:
        lo, la = results["loopback"], results["latency"]
        print(
            f"{name:<15} {lo['median'][name]:>16.1f}  {lo['ratio'][name]:5.0%}  "
            f"{la['median'][name]:>17.1f}  {la['ratio'][name]:5.0%}"
        )
    print("\nqueue micro-benchmark:", json.dumps(results["micro"], indent=2))


if __name__ == "__main__":
    sys.exit(main())
