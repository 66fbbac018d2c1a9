"""Leases are renewed from a thread: a callback that blocks the event loop for two lease
periods keeps its requests, and a second worker neither reclaims nor repeats them (real
`scrapy runspider` processes, real Redis, real site)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LEASE_TIME = 3
FAST_LEASES = {
    "HA_LEASE_TIME": str(LEASE_TIME),
    "HA_LEASE_RENEW_INTERVAL": "1",
    "HA_HEARTBEAT_TTL": "3",
    "HA_RECLAIM_INTERVAL": "1",
    "HA_IDLE_TIMEOUT": "1",
}


def worker(redis_url: str, site_url: str, tmp: Path, name: str, **extra: str):
    settings = {
        **FAST_LEASES,
        "SCHEDULER": "scrapy_ha.Scheduler",
        "REDIS_URL": redis_url,
        "ITEMS_FILE": str(tmp / "items.jl"),
        "FAULT": "block",
        "FAULT_PATH": "/item/3",
        "BLOCK_MARKER": str(tmp / "blocking"),
        "BLOCK_SECONDS": str(2 * LEASE_TIME),
        "CONCURRENT_REQUESTS": "4",
        "LOG_LEVEL": "INFO",
        **extra,
    }
    args = [
        sys.executable,
        "-m",
        "scrapy.cmdline",
        "runspider",
        str(ROOT / "tests" / "worker_fault_spider.py"),
        "-a",
        "name=blocking",
        "-a",
        f"base_url={site_url}",
    ]
    for key, value in settings.items():
        args += ["-s", f"{key}={value}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with (tmp / f"{name}.log").open("wb") as out:
        return subprocess.Popen(args, cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT)


def stat(log: str, name: str) -> int:
    match = re.search(rf"'{re.escape(name)}': (\d+)", log)
    return int(match.group(1)) if match else 0


def test_a_blocking_callback_keeps_its_leases(redis_url, redis_client, site_factory, tmp_path):
    site = site_factory("--pages", "3", "--per-page", "10", "--delay", "0.05")
    # the callback blocks two lease periods, and on until the second worker has joined (a
    # loaded machine starts a Scrapy process slowly): the second must see the first's leases
    release = tmp_path / "release"
    first = worker(redis_url, site.url, tmp_path, "first", BLOCK_UNTIL=str(release))
    second = None
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "blocking").exists():
            assert first.poll() is None and time.monotonic() < deadline, "never blocked"
            time.sleep(0.02)
        second = worker(redis_url, site.url, tmp_path, "second")
        while redis_client.zcard("ha:{blocking}:workers") < 2:
            assert second.poll() is None and time.monotonic() < deadline + 60, "never joined"
            time.sleep(0.05)
        release.write_text("go")
        assert second.wait(timeout=120) == 0
        assert first.wait(timeout=120) == 0
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    logs = {n: (tmp_path / f"{n}.log").read_text() for n in ("first", "second")}
    ids = [json.loads(line)["id"] for line in (tmp_path / "items.jl").read_text().splitlines()]
    assert sorted(ids) == list(range(1, 31)), logs["second"][-3000:]  # each item once
    assert site.hits()["/item/3"] == 1  # crawled once
    assert all(stat(log, "ha/reclaimed") == 0 for log in logs.values()), logs
    assert all(stat(log, "ha/dead/poison") == 0 for log in logs.values())
    assert "The event loop was blocked for" in logs["first"]
    assert "leases were renewed from scrapy-ha's own thread meanwhile" in logs["first"]


def test_a_loop_stuck_past_the_watchdog_stops_renewing(redis_url, site_factory, tmp_path):
    site = site_factory("--pages", "3", "--per-page", "10", "--delay", "0.05")
    release = tmp_path / "release"  # the first stays stuck until the second took over
    first = worker(
        redis_url, site.url, tmp_path, "first", HA_RENEW_WATCHDOG="1.5", BLOCK_UNTIL=str(release)
    )
    second = None
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "blocking").exists():
            assert first.poll() is None and time.monotonic() < deadline, "never blocked"
            time.sleep(0.02)
        second = worker(redis_url, site.url, tmp_path, "second")
        deadline = time.monotonic() + 120  # a slow start under load must not let the first
        while "Reclaimed" not in (tmp_path / "second.log").read_text():  # reclaim its own
            assert second.poll() is None and time.monotonic() < deadline, "never reclaimed"
            time.sleep(0.05)
        release.write_text("go")
        assert second.wait(timeout=120) == 0
        assert first.wait(timeout=120) == 0
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    logs = {n: (tmp_path / f"{n}.log").read_text() for n in ("first", "second")}
    assert "stops renewing its leases" in logs["first"]
    assert stat(logs["second"], "ha/reclaimed") > 0  # the stuck worker's leases moved on
    ids = {json.loads(line)["id"] for line in (tmp_path / "items.jl").read_text().splitlines()}
    assert ids == set(range(1, 31))  # nothing lost


def test_a_stopped_process_says_no_lease_was_renewed_while_it_was(
    redis_url, site_factory, tmp_path
):
    """A QA run: a worker stopped with SIGSTOP for 12 s said on SIGCONT that "leases were
    renewed from scrapy-ha's own thread meanwhile": its thread was stopped too."""
    import signal

    site = site_factory("--pages", "3", "--per-page", "10", "--delay", "0.2")
    first = worker(redis_url, site.url, tmp_path, "first", FAULT_PATH="/never")
    try:
        deadline = time.monotonic() + 60
        items = tmp_path / "items.jl"
        while not (items.exists() and items.read_text().strip()):
            assert first.poll() is None and time.monotonic() < deadline, "never crawled"
            time.sleep(0.05)
        first.send_signal(signal.SIGSTOP)
        time.sleep(LEASE_TIME + 1)  # past the renewal interval (1 s) and the lease
        first.send_signal(signal.SIGCONT)
        assert first.wait(timeout=120) == 0
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    log = (tmp_path / "first.log").read_text()
    assert "The event loop was blocked for" in log, log[-3000:]
    assert "no lease was renewed meanwhile (the process was stopped" in log
    assert "renewed from scrapy-ha's own thread meanwhile" not in log
    ids = {json.loads(line)["id"] for line in (tmp_path / "items.jl").read_text().splitlines()}
    assert ids == set(range(1, 31))  # nothing lost
