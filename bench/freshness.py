"""Revisits: freshness at a fixed bandwidth, fixed interval against adaptive; and the
continuous-crawl soak (two workers for an hour, one SIGKILLed and restarted).

``python bench/freshness.py compare`` starts its own redis-server and, for each run, a
fresh ``bench/freshness_site.py`` (1,000 pages changing as Poisson processes, rates spread
evenly on a log scale from once a minute to once a day, time compressed ``--compress``
times; run *k* draws its changes from seed *k* for both policies); crawls it with one
worker for ``--seconds`` at ``HA_DOMAIN_RATE = --rate`` (the whole crawl's bandwidth),
each page revisited every ``pages / rate`` seconds (fixed), or adaptively
(``HA_REVISIT_ADAPTIVE``, ``HA_REVISIT_MIN``/``MAX`` at 1/8 and 16 times that; the budget,
``HA_REVISIT_BUDGET``'s default, is what the fixed intervals spend: ``rate``), the two
alternated ``--runs`` times; and reads the site's log after ``--warmup`` seconds:
freshness (the time-averaged fraction of pages whose last crawled copy is the live page),
requests per second, and the share of the fetches of unchanged pages answered 304. It
prints the figures, their medians and the ratio adaptive / fixed, and writes them as JSON
to ``--out``.

``python bench/freshness.py soak --seconds 3600`` crawls the site with two workers (fixed
revisits), SIGKILLs one at a third of the run and starts it again, then stops the crawl
with ``scrapy-ha stop`` and checks that no revisit was lost or doubled: in Redis, one entry
per page waiting for its next visit and no revisit counted as a double; at the site, no
page left unfetched for more than twice its interval plus the time the killed worker's
leases took to expire (the wait for its first fetch counted as a gap: a page fetched once,
late, because the killed worker held it, is not lost), and none fetched at less than half
its interval after the restart.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.request import urlopen

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from scrapy_ha.codec.compact import expand  # noqa: E402
from scrapy_ha.demo import harness  # noqa: E402
from scrapy_ha.keys import Keys  # noqa: E402

PAGES = 1000
#: Seconds a worker gets to close once the crawl is stopped.
STOP_TIMEOUT = 120
#: Seconds a killed worker's leases take to come back: HA_LEASE_TIME and HA_RECLAIM_INTERVAL.
RECLAIM = 40.0


def start_site(workdir: Path, seed: int, args: argparse.Namespace) -> tuple[Any, str]:
    site = [sys.executable, str(ROOT / "bench" / "freshness_site.py"), "--pages", str(PAGES)]
    site += ["--seed", str(seed), "--compress", str(args.compress)]
    site += ["--horizon", str(args.seconds + 600)]
    proc, ports = harness.start_listening(site, cwd=workdir)
    return proc, f"http://127.0.0.1:{ports[0]}"


def worker(
    site: str, redis_url: str, settings: dict[str, Any], log: Path
) -> subprocess.Popen[bytes]:
    base = {
        "ADDONS": {"scrapy_ha.Addon": 0},
        "REDIS_URL": redis_url,
        "HA_DOMAIN_RATE": 0,
        "LOG_LEVEL": "INFO",
        "TELNETCONSOLE_ENABLED": False,
    }
    cmd = [sys.executable, "-m", "scrapy.cmdline", "runspider"]
    cmd += [str(ROOT / "bench" / "freshness_spider.py"), "-a", f"base_url={site}"]
    for name, value in {**base, **settings}.items():
        cmd += ["-s", f"{name}={json.dumps(value) if isinstance(value, dict) else value}"]
    out = log.open("ab")
    return harness.spawn(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=str(log.parent))


def scrapy_ha(*args: str) -> str:
    exe = str(Path(sys.executable).parent / "scrapy-ha")
    done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


def stop_crawl(redis_url: str, workers: list[subprocess.Popen[bytes]]) -> None:
    scrapy_ha("stop", "freshness", "--redis-url", redis_url)
    for proc in workers:
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            harness.stop(proc)


def site_stats(site: str, since: float) -> dict[str, Any]:
    with urlopen(f"{site}/_stats?since={since}", timeout=120) as r:
        return dict(json.load(r))


def policy_settings(policy: str, interval: float, rate: float) -> dict[str, Any]:
    settings: dict[str, Any] = {"HA_REVISIT": {"/p/": interval}, "HA_DOMAIN_RATE": rate}
    if policy == "adaptive":
        settings.update(
            HA_REVISIT_ADAPTIVE=True, HA_REVISIT_MIN=interval / 8, HA_REVISIT_MAX=interval * 16
        )
    return settings


def one_run(policy: str, seed: int, args: argparse.Namespace, workdir: Path, redis_port: int):
    import redis

    redis.Redis(port=redis_port).flushall()
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    site_proc, site = start_site(workdir, seed, args)
    interval = PAGES / args.rate
    try:
        log = workdir / f"{policy}-{seed}.log"
        proc = worker(site, redis_url, policy_settings(policy, interval, args.rate), log)
        time.sleep(args.seconds)
        stop_crawl(redis_url, [proc])
        stats = site_stats(site, args.warmup)
    finally:
        harness.stop(site_proc)
    span = args.seconds - args.warmup
    unchanged = stats["unchanged"]
    return {
        "policy": policy,
        "seed": seed,
        "freshness": round(stats["freshness"], 4),
        "requests_per_s": round(stats["fetches"] / span, 2),
        "unchanged_304": round(stats["unchanged_304"] / unchanged, 4) if unchanged else None,
        "not_modified": stats["not_modified"],
        "fetches": stats["fetches"],
        "kb_sent": stats["bytes"] // 1024,
    }


def compare(args: argparse.Namespace, workdir: Path, redis_port: int) -> dict[str, Any]:
    runs = []
    for k in range(1, args.runs + 1):
        for policy in ("fixed", "adaptive") if k % 2 else ("adaptive", "fixed"):
            result = one_run(policy, k, args, workdir, redis_port)
            print(json.dumps(result), flush=True)
            runs.append(result)
    summary: dict[str, Any] = {}
    for policy in ("fixed", "adaptive"):
        mine = [r for r in runs if r["policy"] == policy]
        summary[policy] = {
            key: statistics.median(r[key] for r in mine if r[key] is not None)
            for key in ("freshness", "requests_per_s", "unchanged_304")
        }
    ratio = summary["adaptive"]["freshness"] / summary["fixed"]["freshness"]
    return {"runs": runs, "median": summary, "adaptive_over_fixed": round(ratio, 3)}


def soak(args: argparse.Namespace, workdir: Path, redis_port: int) -> dict[str, Any]:
    import redis

    client = redis.Redis(port=redis_port)
    client.flushall()
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    site_proc, site = start_site(workdir, 1, args)
    interval = PAGES / args.rate
    settings = policy_settings("fixed", interval, args.rate)
    logs = [workdir / f"soak-{i}.log" for i in range(3)]
    workers = [worker(site, redis_url, settings, logs[i]) for i in range(2)]
    events: list[tuple[float, str]] = []
    start = time.time()
    try:
        time.sleep(args.seconds / 3)
        harness.signal_group(workers[1], signal.SIGKILL)
        workers[1].wait()
        events.append((time.time() - start, "SIGKILL worker 2"))
        time.sleep(args.restart_after)
        workers[1] = worker(site, redis_url, settings, logs[2])
        events.append((time.time() - start, "worker 2 started again"))
        time.sleep(max(0.0, start + args.seconds - time.time()))
        stop_crawl(redis_url, workers)
        events.append((time.time() - start, "scrapy-ha stop"))
        return check_soak(client, site, interval, args, events)
    finally:
        for proc in workers:
            harness.stop(proc)
        harness.stop(site_proc)


def check_soak(client: Any, site: str, interval: float, args: argparse.Namespace, events: list):
    keys = Keys("ha", "freshness")
    urls: dict[str, int] = {}
    known = {int(f): d for f, d in client.hgetall(keys.dictionaries).items() if f.isdigit()}

    def count(stored: bytes) -> None:  # a payload as stored: compacted or plain
        url = json.loads(expand(stored, known))["u"]
        urls[url] = urls.get(url, 0) + 1

    payloads = client.hgetall(keys.payload)
    for entry_id in client.zrange(keys.delayed, 0, -1) + client.zrange(keys.leased, 0, -1):
        count(payloads[entry_id])
    for qid in client.zrange(keys.ready, 0, -1) + client.zrange(keys.waiting, 0, -1):
        for element in client.lrange(keys.queue(qid.decode()), 0, -1):
            count(element.partition(b" ")[2])  # "<entry id>[@<place>] <payload>"
    stats = {k.decode(): int(v) for k, v in client.hgetall(keys.stats).items()}
    site_view = site_stats(site, 0)
    pages = site_view["pages"]
    # the wait before a page's first fetch counts as a gap (a page a killed worker held before
    # its first fetch comes back with its lease, and may be fetched once in a short run)
    waits = [max(p["first"], p["max_gap"] or 0) if p["fetches"] else 1e9 for p in pages]
    lost = [i for i, wait in enumerate(waits) if wait > 2 * interval + RECLAIM]
    tail = [i for i, p in enumerate(pages) if (p["last"] or 0) < args.seconds - 2 * interval]
    return {
        "seconds": args.seconds,
        "interval": interval,
        "events": events,
        "entries": sum(urls.values()),
        "pages_with_one_entry": sum(1 for n in urls.values() if n == 1),
        "pages_with_more": sum(1 for n in urls.values() if n > 1),
        "revisit_double": stats.get("revisit_double", 0),
        "revisited": stats.get("revisited", 0),
        "reclaimed": stats.get("reclaimed", 0),
        "fetches": site_view["fetches"],
        "pages_fetched": sum(1 for p in pages if p["fetches"]),
        "max_gap": max((p["max_gap"] or 0) for p in pages),
        "min_gap": min((p["min_gap"] or 1e9) for p in pages),
        "pages_not_fetched_for_2_intervals": len(lost),
        "pages_fetched_once": sum(1 for p in pages if p["fetches"] == 1),
        "latest_first_fetch": round(max((p["first"] or 0) for p in pages), 1),
        "pages_stopped_being_fetched": len(tail),
        "freshness": round(site_view["freshness"], 4),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("compare", "soak"))
    parser.add_argument("--compress", type=float, default=288.0, help="simulated s per real s")
    parser.add_argument("--rate", type=float, default=20.0, help="HA_DOMAIN_RATE, requests/s")
    parser.add_argument("--seconds", type=float, default=480.0, help="real seconds per run")
    parser.add_argument("--warmup", type=float, default=120.0, help="seconds not measured")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--restart-after", type=float, default=60.0, help="soak: seconds")
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--workdir", type=Path, help="keep the run's files (Redis's, the workers' logs) here"
    )
    args = parser.parse_args()
    with harness.work_dir("scrapy-ha-freshness-", args.workdir) as workdir:
        redis_proc, redis_port = harness.start_redis(workdir / "redis", args=["--appendonly", "no"])
        try:
            started = time.time()
            load = os.getloadavg()
            result = (compare if args.mode == "compare" else soak)(args, workdir, redis_port)
            result.update(args={k: str(v) for k, v in vars(args).items()}, load_at_start=load)
            result.update(load_at_end=os.getloadavg(), wall_seconds=round(time.time() - started))
        finally:
            harness.stop(redis_proc)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
