"""Real `scrapy crawl` processes of the example project, SIGKILLed mid-crawl.

Another worker finishes the crawl: every item arrives, and only what the killed
worker had in flight may be crawled twice.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from scrapy_ha.keys import Keys
from tests import backqueues
from tests.dupefilter import dupefilter_settings

EXAMPLE = Path(__file__).resolve().parent.parent / "example_project"
#: Short leases so that the surviving worker reclaims within seconds; long enough that a
#: live worker the machine starves for a few seconds (a loaded 2-core machine did, with 3 s:
#: its leases expired and were redone, some pages three times) still renews them in time:
#: renewed every second, a lease outlives a stall of 5 s.
FAST_LEASES = {
    "HA_LEASE_TIME": "6",
    "HA_LEASE_RENEW_INTERVAL": "1",
    "HA_HEARTBEAT_TTL": "3",
    "HA_RECLAIM_INTERVAL": "1",
    "HA_IDLE_TIMEOUT": "1",
}
CONCURRENCY = 16
#: What one worker that dies uncleanly can make others redo, counted by the site (not by the
#: workers): its prefetch buffer (HA_PREFETCH = CONCURRENCY), its unfinished requests
#: (HA_MAX_INFLIGHT = 2 x CONCURRENCY) and the acks of one round trip (CONCURRENCY): the
#: leases it holds at most (docs/reliability.md).
PER_KILL = 4 * CONCURRENCY
#: Seconds without a new item after which a crawl counts as stuck: a busy machine makes a
#: crawl slow, never silent for this long (a test waits on progress, not on a total time).
STALL = 120.0
#: Seconds between two looks at the leases a worker holds (a round lasts longer).
SAMPLE = 0.002


def worker(
    redis_url: str, site_url: str, items: Path, log: Path, **extra: str
) -> subprocess.Popen[bytes]:
    settings = {
        **FAST_LEASES,
        "REDIS_URL": redis_url,
        "ITEMS_FILE": str(items),
        "CONCURRENT_REQUESTS": str(CONCURRENCY),
        "LOG_LEVEL": "INFO",
        **dupefilter_settings(),
        **extra,
    }
    args = [
        sys.executable,
        "-m",
        "scrapy.cmdline",
        "crawl",
        "catalogue",
        "-a",
        f"base_url={site_url}",
    ]
    for name, value in settings.items():
        args += ["-s", f"{name}={value}"]
    env = {**os.environ, "PYTHONPATH": str(EXAMPLE.parent)}
    with log.open("wb") as out:
        return subprocess.Popen(args, cwd=EXAMPLE, env=env, stdout=out, stderr=subprocess.STDOUT)


def count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


class Progress:
    """The items stored so far, and whether one came within the last ``STALL`` seconds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.count = count_lines(path)
        self._since = time.monotonic()

    def check(self) -> int:
        """The items stored now; fails when none came for ``STALL`` seconds."""
        count = count_lines(self.path)
        if count != self.count:
            self.count, self._since = count, time.monotonic()
        assert time.monotonic() - self._since < STALL, (
            f"no new item for {STALL:g} s ({count} stored)"
        )
        return count


def wait_for_items(path: Path, n: int, proc: subprocess.Popen[bytes]) -> None:
    """Wait until *path* holds *n* items, as long as items keep coming."""
    progress = Progress(path)
    while progress.check() < n:
        assert proc.poll() is None, "the worker ended before it was killed"
        time.sleep(0.01)


def finish(proc: subprocess.Popen[bytes], items: Path) -> int:
    """Wait for *proc* to exit, as long as items keep coming (or it stops within ``STALL``
    seconds of the last one); its exit status."""
    progress = Progress(items)
    while proc.poll() is None:
        try:
            progress.check()
        except AssertionError:
            proc.kill()
            raise
        time.sleep(0.05)
    return proc.returncode


class LeaseWatch:
    """The most leases the crawl's workers held at once in Redis, looked at every
    ``SAMPLE`` seconds from a thread: what a SIGKILL at the worst instant would leave to
    redo, not only what it left at the instant it came."""

    def __init__(self, redis_url: str, spider: str = "catalogue") -> None:
        self.most = 0
        self._client = redis.Redis.from_url(redis_url)
        self._key = f"ha:{{{spider}}}:leased"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> LeaseWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._client.close()

    def _watch(self) -> None:
        while not self._stop.wait(SAMPLE):
            self.most = max(self.most, int(self._client.zcard(self._key)))


def reclaimed(log: str) -> int:
    return stat(log, "ha/reclaimed")


def stat(log: str, name: str) -> int:
    """A counter of the crawl's final stats in its log (0 when absent)."""
    match = re.search(rf"'{name}': (\d+)", log)
    return int(match.group(1)) if match else 0


def check_nothing_lost(
    items: Path,
    expected: int,
    hits: dict[str, int],
    bound: int,
    logs: tuple[Path, ...] = (),
) -> None:
    """Every item stored; at most *bound* pages crawled twice (by the site's count) and at
    most *bound* items stored twice; no page crawled three times. On this site a page has
    one link to it, on its parent page: a worker meets it again only by redoing that page,
    and such a page's links never download early (before 2026-12-04 they did once it was
    done: downloaded by the killed worker, early, then by the redo of its lease). A loss,
    or a page crawled three times, is told with the scheduler's figures in the workers'
    *logs* (``ha/early_dropped``, ``ha/leases_lost``), and a loss with whether the site
    served the lost items' pages."""
    ids = [json.loads(line)["id"] for line in items.read_text().splitlines()]
    assert sorted(set(ids)) == list(range(1, expected + 1)), lost_report(
        set(range(1, expected + 1)) - set(ids), hits, logs
    )
    twice = {path: n for path, n in hits.items() if n > 1}
    more = {path: n for path, n in twice.items() if n > 2}
    assert not more, f"crawled three times or more: {more}\n{figures(logs)}"
    assert len(twice) <= bound, f"{len(twice)} pages crawled twice, bound {bound}"
    assert len(ids) - len(set(ids)) <= bound, f"{len(ids) - len(set(ids))} items stored twice"


def lost_report(lost: set[int], hits: dict[str, int], logs: tuple[Path, ...]) -> str:
    """How many items were lost, each one's page and how often the site served it (never:
    no worker downloaded it), and the ``ha/`` figures of each log's stats dump."""
    served = ", ".join(f"/item/{n} served {hits.get(f'/item/{n}', 0)}x" for n in sorted(lost))
    return f"lost {len(lost)} item(s): {served[:2000]}\n{figures(logs)}"


def figures(logs: tuple[Path, ...]) -> str:
    """The ``ha/`` figures of each log's stats dump, a line a log."""
    return "\n".join(
        f"{log.name}: " + " ".join(re.findall(r"'ha/[^']*': [^,}]+", log.read_text()))
        for log in logs
        if log.exists()
    )


@pytest.mark.parametrize(
    "kill_after",
    [1, 700, pytest.param(1900, marks=pytest.mark.long)],  # (a kill near the end: test-long)
)
def test_sigkill_one_of_two_workers_loses_nothing(kill_after, redis_url, site_factory, tmp_path):
    pages, per_page = 100, 20
    site = site_factory(
        "--pages", str(pages), "--per-page", str(per_page), "--delay", "0.002", "--chains", "5"
    )
    items = tmp_path / "items.jl"
    victim = worker(redis_url, site.url, items, tmp_path / "victim.log")
    wait_for_items(items, 1, victim)
    survivor = worker(redis_url, site.url, items, tmp_path / "survivor.log")
    wait_for_items(items, kill_after, victim)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert finish(survivor, items) == 0, (tmp_path / "survivor.log").read_text()[-3000:]
    log = (tmp_path / "survivor.log").read_text()
    assert "'finish_reason': 'finished'" in log
    # The victim held its prefetch buffer (HA_PREFETCH = CONCURRENCY), at most HA_MAX_INFLIGHT
    # (2 x CONCURRENCY) unfinished requests, and the acks of one round trip.
    assert reclaimed(log) <= PER_KILL
    logs = (tmp_path / "victim.log", tmp_path / "survivor.log")
    check_nothing_lost(items, pages * per_page, site.hits(), PER_KILL, logs=logs)


@pytest.mark.parametrize(
    "pages, kill_at, early",
    [
        (100, 800, False),  # the same scenario, short enough for every CI run
        # about a minute alone, past the suite's 300 s beside three other long tests and
        # other jobs (10,000 items at 600 pages a minute under a load of 38): test-long
        pytest.param(500, 4000, False, marks=[pytest.mark.long, pytest.mark.timeout(1200)]),
        (100, 800, True),
    ],
    ids=["2000-items", "10000-items", "2000-items-early-downloads"],
)
def test_sigkill_then_resume_a_crawl(
    pages, kill_at, early, redis_url, site_factory, tmp_path, record_property
):
    """The first worker, alone (a LIFO worker alone keeps its new requests in its buffer),
    never holds more leases than the bound, at any instant, with or without early
    downloads: the kill may come at the worst one. With HA_EARLY_DOWNLOAD it downloaded
    some of its new requests before Redis stored them; those are among its unfinished
    requests, within the same bound, and the second worker takes none of them three
    times: the links of a page the first left unfinished, which it redoes, never download
    early (they reach the engine during that page or after it)."""
    per_page = 20
    extra = {"HA_EARLY_DOWNLOAD": str(early)}
    site = site_factory("--pages", str(pages), "--per-page", str(per_page), "--chains", "10")
    items = tmp_path / "items.jl"
    with LeaseWatch(redis_url) as held:
        first = worker(redis_url, site.url, items, tmp_path / "first.log", **extra)
        wait_for_items(items, kill_at, first)
        first.send_signal(signal.SIGKILL)
        first.wait()
    record_property("max_held_leases", held.most)  # in --junitxml: the figure per run
    assert held.most <= PER_KILL, f"the worker held {held.most} leases at once"
    second = worker(redis_url, site.url, items, tmp_path / "second.log", **extra)
    assert finish(second, items) == 0, (tmp_path / "second.log").read_text()[-3000:]
    log = (tmp_path / "second.log").read_text()
    assert 0 < reclaimed(log) <= PER_KILL  # the killed worker's leases came back
    logs = (tmp_path / "first.log", tmp_path / "second.log")
    check_nothing_lost(items, pages * per_page, site.hits(), bound=PER_KILL, logs=logs)


def test_sigint_releases_leases_at_once_and_a_second_run_finishes(
    redis_url, redis_client, site_factory, tmp_path
):
    pages, per_page = 60, 20
    site = site_factory(
        "--pages", str(pages), "--per-page", str(per_page), "--delay", "0.01", "--chains", "4"
    )
    items = tmp_path / "items.jl"
    first = worker(redis_url, site.url, items, tmp_path / "first.log")
    wait_for_items(items, 200, first)
    first.send_signal(signal.SIGINT)  # what scrapyd's cancel sends
    assert finish(first, items) == 0
    log = (tmp_path / "first.log").read_text()
    assert "'finish_reason': 'shutdown'" in log and "Released" in log
    assert redis_client.zcard("ha:{catalogue}:leased") == 0  # nothing left to expire
    assert backqueues.count(redis_client, Keys("ha", "catalogue")) > 0
    second = worker(redis_url, site.url, items, tmp_path / "second.log")
    assert finish(second, items) == 0
    assert reclaimed((tmp_path / "second.log").read_text()) == 0
    check_nothing_lost(items, pages * per_page, site.hits(), bound=0)


def wait_for_log(path: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in path.read_text(errors="replace"):
        assert proc.poll() is None, f"the worker ended before it logged {text!r}"
        assert time.monotonic() < deadline, f"no {text!r} in the log after {timeout} s"
        time.sleep(0.01)


def test_a_second_ctrl_c_stops_the_worker_and_loses_nothing(redis_url, site_factory, tmp_path):
    """Ctrl-C twice: Scrapy stops at once, without releasing its leases; they expire and
    another worker takes them over."""
    pages, per_page = 60, 20
    site = site_factory(
        "--pages", str(pages), "--per-page", str(per_page), "--delay", "0.05", "--chains", "4"
    )
    items, first_log = tmp_path / "items.jl", tmp_path / "first.log"
    first = worker(redis_url, site.url, items, first_log)
    wait_for_items(items, 200, first)
    first.send_signal(signal.SIGINT)
    wait_for_log(first_log, "shutting down gracefully", first)
    first.send_signal(signal.SIGINT)
    finish(first, items)  # stopped: no hang after the second Ctrl-C
    assert "forcing unclean shutdown" in first_log.read_text()
    second = worker(redis_url, site.url, items, tmp_path / "second.log")
    assert finish(second, items) == 0, (tmp_path / "second.log").read_text()[-3000:]
    check_nothing_lost(items, pages * per_page, site.hits(), bound=PER_KILL)


def test_sigkill_while_retries_wait_loses_none_of_them(
    redis_url, redis_client, site_factory, tmp_path
):
    pages, per_page = 40, 20
    site = site_factory(
        "--pages",
        str(pages),
        "--per-page",
        str(per_page),
        "--chains",
        "4",
        "--fault",
        "404:50:99",
        "--fault",
        "503:7:1",
        "--fault",
        "429:130:1:1",
        "--fault",
        "timeout:31:1",
        "--fault",
        "broken:17:1",
    )
    retries = {
        "HA_RETRY_BACKOFF_BASE": "2",
        "DOWNLOAD_TIMEOUT": "2",
        "HA_RETRY_POLICIES": '{"network": {"base": 2}, "parse": {"base": 2}}',
    }
    items = tmp_path / "items.jl"
    victim = worker(redis_url, site.url, items, tmp_path / "victim.log", **retries)
    wait_for_items(items, 300, victim)
    waiting = redis_client.zcard("ha:{catalogue}:delayed")
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    survivor = worker(redis_url, site.url, items, tmp_path / "survivor.log", **retries)
    assert finish(survivor, items) == 0, (tmp_path / "survivor.log").read_text()[-3000:]
    assert waiting > 0, "no retry was waiting when the worker was killed"
    ids = {json.loads(line)["id"] for line in items.read_text().splitlines()}
    gone = {n for n in range(1, pages * per_page + 1) if n % 50 == 0}
    assert ids == set(range(1, pages * per_page + 1)) - gone
    dead = [json.loads(v) for v in redis_client.hvals("ha:{catalogue}:dead_info")]
    assert sorted(d["class"] for d in dead) == ["gone"] * len(gone)


def test_sigkill_loses_no_item_of_a_feed_export(redis_url, site_factory, tmp_path):
    """``scrapy crawl -o items.jl`` with the add-on: Scrapy's file storage kept the items of
    the last 8 KB in Python's buffer, and a SIGKILL lost them (10 to 13 a kill, in a
    walkthrough), their pages acked (scrapy_ha/sinks/feeds.py)."""
    pages, per_page = 100, 20
    site = site_factory(
        "--pages", str(pages), "--per-page", str(per_page), "--delay", "0.002", "--chains", "5"
    )
    feeds = {name: tmp_path / f"{name}.jl" for name in ("victim", "survivor")}

    def start(name: str) -> subprocess.Popen[bytes]:
        feed = json.dumps({str(feeds[name]): {"format": "jsonlines"}})
        log = tmp_path / f"{name}.log"
        return worker(redis_url, site.url, tmp_path / "unused.jl", log, ITEMS_FILE="", FEEDS=feed)

    victim = start("victim")
    wait_for_items(feeds["victim"], 1, victim)
    survivor = start("survivor")
    wait_for_items(feeds["victim"], 500, victim)
    # then some acks more: a kill right after the file grew met a buffer just flushed
    client = redis.Redis.from_url(redis_url)
    stats = Keys("ha", "catalogue").stats
    acked = int(client.hget(stats, "acked") or 0)
    while int(client.hget(stats, "acked") or 0) < acked + 40:
        assert victim.poll() is None and survivor.poll() is None, "a worker ended"
        time.sleep(0.005)
    client.close()
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert finish(survivor, feeds["survivor"]) == 0, (tmp_path / "survivor.log").read_text()[-3000:]
    both = tmp_path / "both.jl"
    both.write_text(feeds["victim"].read_text() + feeds["survivor"].read_text())
    logs = (tmp_path / "victim.log", tmp_path / "survivor.log")
    check_nothing_lost(both, pages * per_page, site.hits(), PER_KILL, logs=logs)
