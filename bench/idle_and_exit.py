"""Two of the static-site targets, measured on whole ``scrapy runspider`` processes:

- ``idle``: the CPU an idle worker uses (a feed-mode ``RedisSpider`` with nothing to do),
  over ``--seconds`` after ``--settle`` seconds of start-up, read from ``/proc``;
- ``exit``: the seconds from a crawl's last response to its process's exit, and to Scrapy's
  "Closing spider", for each scheduler in turn (one list page of the static site, 21 pages;
  the times come from the log, ``%(created)``, and ``time.time()`` at exit).

``python bench/idle_and_exit.py idle`` / ``python bench/idle_and_exit.py exit --runs 5``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
for path in (ROOT, BENCH):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
import static_bench  # noqa: E402
import static_site  # noqa: E402

from scrapy_ha.demo import harness  # noqa: E402

IDLE_SPIDER = """from scrapy_ha.spiders import RedisSpider


class IdleSpider(RedisSpider):
    name = "idle"

    def parse(self, response):
        pass
"""


def idle(args: argparse.Namespace, work: Path, redis_port: int) -> None:
    spider = work / "idle_spider.py"
    spider.write_text(IDLE_SPIDER)
    settings = {**static_bench.COMMON_SETTINGS, "SCHEDULER": "scrapy_ha.Scheduler"}
    settings["REDIS_URL"] = f"redis://127.0.0.1:{redis_port}/0"
    command = [sys.executable, "-m", "scrapy.cmdline", "runspider", str(spider)]
    for key, value in settings.items():
        command += ["-s", f"{key}={value}"]
    proc = harness.spawn(command, cwd=work, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        time.sleep(args.settle)
        before, started = static_site.cpu_seconds(proc.pid), time.monotonic()
        time.sleep(args.seconds)
        used = static_site.cpu_seconds(proc.pid) - before
        seconds = time.monotonic() - started
    finally:
        harness.stop(proc)
    share = 100 * used / seconds
    print(f"idle worker: {used:.2f} s of CPU in {seconds:.1f} s, {share:.2f}% of a core")


def exit_lag(args: argparse.Namespace, work: Path, redis_port: int) -> None:
    import redis

    names = args.schedulers.split(",")
    to_exit: dict[str, list[float]] = {name: [] for name in names}
    to_closing: dict[str, list[float]] = {name: [] for name in names}
    with static_site.StaticSite(work / "nginx", 1) as site:
        for run in range(args.runs):
            for name in static_bench.order(names, run):
                redis.Redis(port=redis_port).flushall()
                settings = static_bench.crawl_settings(name, redis_port, 32, work / "out.json")
                settings["LOG_LEVEL"] = "DEBUG"
                settings["LOG_FORMAT"] = "%(created).3f %(name)s %(message)s"
                static_bench.run_timed(static_bench.crawl_command(site.url, settings), work)
                ended = time.time()
                lines = (work / "crawl.log").read_text().splitlines()  # its stderr
                last = max(float(line.split()[0]) for line in lines if "Crawled (" in line)
                closing = min(float(line.split()[0]) for line in lines if "Closing spider" in line)
                to_exit[name].append(ended - last)
                to_closing[name].append(closing - last)
                print(
                    f"  {name:<12} last response -> 'Closing spider' {closing - last:.3f} s, "
                    f"-> exit {ended - last:.3f} s",
                    flush=True,
                )
    for name in names:
        print(
            f"{name}: median {statistics.median(to_exit[name]):.3f} s to exit, "
            f"{statistics.median(to_closing[name]):.3f} s to 'Closing spider'"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["idle", "exit"])
    parser.add_argument("--seconds", type=float, default=30.0, help="idle: measured")
    parser.add_argument("--settle", type=float, default=8.0, help="idle: start-up left out")
    parser.add_argument("--runs", type=int, default=5, help="exit: crawls per scheduler")
    parser.add_argument("--schedulers", default="memory,scrapy-ha", help="exit")
    args = parser.parse_args(argv)
    with harness.work_dir("scrapy-ha-idle-exit-") as work:
        proc, port = harness.start_redis(work / "redis", args=["--appendonly", "no"])
        try:
            (idle if args.what == "idle" else exit_lag)(args, work, port)
        finally:
            harness.stop(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
