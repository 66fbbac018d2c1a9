"""The demo: a distributed crawl that survives a killed worker.

``python -m scrapy_ha.demo.run`` (``make demo``) starts its own redis-server
(private directory, AOF on), the demo catalogue site (with slow pages, timeouts,
5xx, 429 with Retry-After, 404s, pages that break the parser, and one proxy exit
it bans), a forward proxy with three exits, and three ``scrapy crawl`` workers
of the example project; SIGKILLs one mid-crawl; lets the others finish; prints
a report; and exits non-zero if any item was lost. Every process it started is
stopped before it returns.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.request import urlopen

from scrapy_ha.demo import harness
from scrapy_ha.keys import Keys
from scrapy_ha.store.payloads import read_payload_sync

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable

ROOT = Path(__file__).resolve().parents[2]
#: The example project of a source checkout (an installed package takes ``--project``).
EXAMPLE = ROOT / "example_project"
#: Whether scrapy_ha runs from a source checkout (not installed): workers need it on the path.
FROM_SOURCE = (ROOT / "pyproject.toml").exists() and (ROOT / "scrapy_ha").is_dir()
#: Short leases so that the demo shows a reclaim within seconds.
DEMO_SETTINGS = {
    "HA_LEASE_TIME": "5",
    "HA_LEASE_RENEW_INTERVAL": "1",
    "HA_HEARTBEAT_TTL": "5",
    "HA_RECLAIM_INTERVAL": "1",
    "HA_IDLE_TIMEOUT": "2",
    "CONCURRENT_REQUESTS": "16",
    "DOWNLOAD_TIMEOUT": "3",
    "HA_RETRY_BACKOFF_BASE": "1",
    "HA_RETRY_POLICIES": '{"network": {"base": 1}, "parse": {"base": 1}}',
    "LOG_LEVEL": "INFO",
}
#: The site's faults (STATUS:EVERY:TIMES[:RETRY_AFTER]): item pages whose id is a multiple
#: of EVERY fail their first TIMES hits. 404s never recover: they end in the dead-letter queue.
FAULTS = ["404:97:99", "503:7:1", "500:11:2", "429:131:1:1", "timeout:211:1", "broken:53:1"]
GONE_EVERY = 97
#: Seconds worker 1 stays stopped before its leases are counted (its calls in flight end).
SETTLE = 0.3
#: Seconds with worker 1 stopped in which the others renew every lease of theirs (twice
#: their renewal interval, and shorter than the lease time less one: see `_unrenewed`).
QUIET = 2 * float(DEMO_SETTINGS["HA_LEASE_RENEW_INTERVAL"])
BANNED_EXIT = "127.0.0.2"


class Demo:
    def __init__(self, workdir: Path, pages: int, per_page: int, project: Path = EXAMPLE) -> None:
        self.dir = workdir
        self.project = project
        self.pages, self.per_page = pages, per_page
        self.procs: list[subprocess.Popen[bytes]] = []
        self.items = workdir / "items.jl"
        self.redis_url = ""
        self.site_url = ""
        self.proxy_url = ""
        self.proxy_password = ""

    def start_redis(self) -> None:
        try:
            proc, port = harness.start_redis(
                self.dir / "redis", args=["--appendonly", "yes", "--appendfsync", "everysec"]
            )
        except (FileNotFoundError, RuntimeError) as exc:
            sys.exit(f"{exc} (`make demo` installs redis-server)")
        self.procs.append(proc)
        self.redis_url = f"redis://127.0.0.1:{port}/0"

    def start_site(self) -> None:
        args = [
            "--pages",
            str(self.pages),
            "--per-page",
            str(self.per_page),
            "--delay",
            "0.01",
            "--chains",
            "10",
            "--ban-exit",
            BANNED_EXIT,
        ]
        for fault in FAULTS:
            args += ["--fault", fault]
        proc, self.site_url = harness.start_site(*args)
        self.procs.append(proc)

    def start_proxy(self) -> None:
        self.proxy_password = uuid.uuid4().hex
        proc, port = harness.start_proxy(
            "--user", "demo", "--password", self.proxy_password, "--exits", "3"
        )
        self.procs.append(proc)
        self.proxy_url = f"http://demo:{self.proxy_password}@127.0.0.1:{port}"

    def worker(self, n: int) -> subprocess.Popen[bytes]:
        args = [
            sys.executable,
            "-m",
            "scrapy.cmdline",
            "crawl",
            "catalogue",
            "-a",
            f"base_url={self.site_url}",
            "-s",
            f"REDIS_URL={self.redis_url}",
            "-s",
            f"ITEMS_FILE={self.items}",
        ]
        for name, value in DEMO_SETTINGS.items():
            args += ["-s", f"{name}={value}"]
        paths = [str(self.project), *([str(ROOT)] if FROM_SOURCE else [])]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(paths),
            "HA_PROXY_MODE": "tunnel",
            "HA_PROXY_URL": self.proxy_url,
        }
        with (self.dir / f"worker{n}.log").open("wb") as log:
            proc = harness.spawn(args, cwd=self.project, env=env, stdout=log, stderr=log)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        """Stop every process the demo started, each with its process group."""
        for proc in self.procs:
            harness.stop(proc)


def _wait_for(check: Any, what: str, timeout: float = 30) -> Any:
    """Poll *check* until it gives something true, and return that (this is the demo CLI
    process: no reactor runs here to block)."""
    try:
        return harness.wait_for(check, what, timeout)
    except harness.Timeout as exc:
        raise SystemExit(str(exc)) from None


def _count_items(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _granted_to(redis_url: str, pid: int) -> int:
    """Of the leases the latest round of the worker of process *pid* took (its grant:
    ``"<id>" -> "<token>"``, under an id ``host:pid[:job]:random``), those Redis still holds
    under the same token: not acked, not lost to another worker. Call it while the worker
    is stopped, and they are leases it holds and can no longer give back. (A round that
    leases nothing deletes the grant: then this says 0 whatever the worker holds.)"""
    import redis

    keys = Keys("ha", "catalogue")
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        for key in client.scan_iter(match=keys.grant("*"), count=1000):
            if key[len(keys.grant("")) :].split(":")[1:2] != [str(pid)]:
                continue
            granted: dict[str, str] = client.hgetall(key)  # type: ignore[assignment]
            if not granted:
                return 0
            records: list[str | None] = client.hmget(keys.leases, list(granted))  # type: ignore[assignment]
            return sum(
                1
                for token, record in zip(granted.values(), records, strict=True)
                if record is not None and record.split(" ", 1)[0] == token
            )
    finally:
        client.close()
    return 0


def _unrenewed(redis_url: str, quiet: Callable[[], object]) -> int:
    """The leases nobody renews from now (Redis's clock) to the end of *quiet()* (a sleep of
    ``QUIET`` seconds): call it with worker 1 stopped (its calls in flight ended), and they
    are worker 1's. Every lease's expiry in ``leased`` is its last renewal's (or its
    grant's) time + the lease time; the live workers renew all theirs each
    ``HA_LEASE_RENEW_INTERVAL`` and lease new ones later than now, so after twice that only
    the stopped worker's still expire by now + the lease time. None has expired yet (the
    lease time is longer than ``QUIET`` + a renewal interval): none was reclaimed."""
    import redis

    keys = Keys("ha", "catalogue")
    lease_ms = int(DEMO_SETTINGS["HA_LEASE_TIME"]) * 1000
    client = redis.Redis.from_url(redis_url)
    try:
        seconds, micros = client.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        quiet()
        # before now + the lease time: a renewal in the same millisecond is a live one
        return int(client.zcount(keys.leased, "-inf", f"({now_ms + lease_ms}"))
    finally:
        client.close()


def _stat(log: str, name: str) -> int:
    match = re.search(rf"'{re.escape(name)}': (\d+)", log)
    return int(match.group(1)) if match else 0


def run(demo: Demo, kill_at: int) -> int:
    demo.start_redis()
    demo.start_site()
    demo.start_proxy()
    expected = demo.pages * demo.per_page
    print(
        f"Redis {demo.redis_url} (AOF on), site {demo.site_url}: {expected} items on "
        f"{demo.pages} list pages in 10 chains, faults {' '.join(FAULTS)}, proxy exit "
        f"{BANNED_EXIT} banned; a tunnel proxy with 3 exits; starting 3 workers"
    )
    started = time.monotonic()
    workers = [demo.worker(n) for n in (1, 2, 3)]
    victim = workers[0]

    # mid-crawl, and holding leases (a worker slow to start may hold none when the others
    # have stored kill_at items; a count it published a moment ago may be all acked since):
    # worker 1 is stopped, its calls in flight given time to end in Redis, and killed if
    # Redis still holds leases for it (those of its latest round, else those nobody renews
    # while it is stopped), else let go on and looked at again
    def holding() -> int:
        if _count_items(demo.items) < kill_at:
            return 0
        victim.send_signal(signal.SIGSTOP)
        time.sleep(SETTLE)
        held = _granted_to(demo.redis_url, victim.pid) or _unrenewed(
            demo.redis_url, lambda: time.sleep(QUIET)
        )
        if not held:
            victim.send_signal(signal.SIGCONT)
            time.sleep(SETTLE)  # a round to take leases before the next look
        return held

    held = _wait_for(holding, f"{kill_at} items and worker 1 holding leases", timeout=300)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    print(
        f"SIGKILLed worker 1 after {_count_items(demo.items)} items, holding {held} lease(s) "
        "or more; workers 2 and 3 go on"
    )
    for proc in workers[1:]:
        proc.wait(timeout=600)
    return report(demo, expected, time.monotonic() - started)


def report(demo: Demo, expected: int, elapsed: float) -> int:
    ids = [json.loads(line)["id"] for line in demo.items.read_text().splitlines()]
    with urlopen(demo.site_url + "/_hits") as r:
        hits: dict[str, int] = json.load(r)
    logs = [(demo.dir / f"worker{n}.log").read_text(errors="replace") for n in (2, 3)]
    dead = _dead_letters(demo.redis_url)
    gone = {n for n in range(1, expected + 1) if n % GONE_EVERY == 0}
    wanted = set(range(1, expected + 1)) - gone
    # Only the pages the site removed for good may be missing, and only as "gone" dead
    # letters: an item dead-lettered for any other reason is lost.
    lost = sorted(wanted - set(ids))
    gone_dead = {_item_id(url) for url, cls in dead if cls == "gone"} & gone
    leaked = [
        name
        for name in demo.dir.glob("*.log")
        if demo.proxy_password in name.read_text(errors="replace")
    ]
    rows: list[tuple[str, Any]] = [
        ("items expected (404s excluded)", len(wanted)),
        ("items stored", len(ids)),
        ("unique items", len(set(ids))),
        ("items stored twice", len(ids) - len(set(ids))),
        ("items lost", len(lost)),
        ("gone (404) items dead-lettered as gone", len(gone_dead)),
        ("gone (404) items expected", len(gone)),
        ("pages crawled", len(hits)),
        ("pages fetched again (retries)", sum(1 for n in hits.values() if n > 1)),
        ("leases reclaimed (worker 1's)", sum(_stat(log, "ha/reclaimed") for log in logs)),
        ("proxy rotations", sum(_stat(log, "ha/proxy/rotations") for log in logs)),
        ("elapsed seconds", round(elapsed, 1)),
    ]
    classes = ("network", "server", "rate_limited", "banned", "parse")
    retries = [(f"  {c}", sum(_stat(log, f"ha/retry/{c}") for log in logs)) for c in classes]
    by_class: dict[str, int] = {}
    for _, cls in dead:
        by_class[cls] = by_class.get(cls, 0) + 1
    print("\nscrapy-ha demo report")
    for name, value in rows:
        print(f"  {name:<36}{value:>8}")
    print("  retries by workers 2 and 3, per class:")
    for name, value in retries:
        print(f"  {name:<36}{value:>8}")
    print("  dead-letter entries, per class:")
    for cls, n in sorted(by_class.items()):
        print(f"    {cls:<34}{n:>8}")
    print(f"  proxy password in any log             {'YES: ' + str(leaked) if leaked else 'no'}")
    print(
        f"\nLogs and data in {demo.dir}. The demo's Redis has stopped; to look at the crawl "
        f"again, start it on its data (a free port, here 6390): redis-server --dir "
        f"{demo.dir / 'redis'} --appendonly yes --port 6390 --daemonize yes, then: "
        "scrapy-ha --redis-url redis://127.0.0.1:6390/0 dlq list catalogue"
    )
    if lost or leaked or gone_dead != gone:
        if lost:
            print(f"FAILED: {len(lost)} item(s) lost {lost[:20]}")
        if gone_dead != gone:
            print(f"FAILED: gone items not dead-lettered as gone: {sorted(gone - gone_dead)[:20]}")
        if leaked:
            print(f"FAILED: the proxy password is in {leaked}")
        return 1
    print("OK: nothing was lost")
    return 0


def _item_id(url: str) -> int:
    """The item id of a detail page URL (``.../item/ID``), else 0."""
    head, _, tail = url.rpartition("/")
    return int(tail) if head.endswith("/item") and tail.isdigit() else 0


def _dead_letters(redis_url: str) -> list[tuple[str, str]]:
    """(url, class) of every dead-letter entry."""
    import redis

    client = redis.Redis.from_url(redis_url)
    keys = Keys("ha", "catalogue")
    out = []
    for entry_id, info in client.hgetall(keys.dead_info).items():
        entry = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        payload = read_payload_sync(client, keys, entry) or b"{}"
        out.append((json.loads(payload).get("u", "?"), json.loads(info).get("class", "?")))
    client.close()
    return out


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=250)
    parser.add_argument("--per-page", type=int, default=20)
    parser.add_argument("--dir", type=Path, default=ROOT / ".demo")
    parser.add_argument(
        "--project",
        type=Path,
        default=EXAMPLE,
        help="the example project (a copy of the repository's example_project)",
    )
    args = parser.parse_args(argv)
    if not (args.project / "scrapy.cfg").exists():
        parser.error(
            f"--project {args.project}: no scrapy.cfg there; pass a copy of the "
            "repository's example_project"
        )
    shutil.rmtree(args.dir, ignore_errors=True)
    args.dir.mkdir(parents=True)
    demo = Demo(args.dir, args.pages, args.per_page, args.project.resolve())
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # so that `finally` stops every process
    try:
        return run(demo, kill_at=args.pages * args.per_page // 3)
    finally:
        demo.stop_all()


if __name__ == "__main__":
    sys.exit(main())
