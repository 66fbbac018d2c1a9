"""The crawl-wide counters after real crawls of the demo site (retries, dead letters,
duplicates, children), and ``scrapy-ha status`` showing them: text, ``--json`` and ``--watch``
(the real command)."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING

import pytest
import redis
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.keys import Keys
from scrapy_ha.ops.stats import read_crawl_stats
from tests.spiders import CatalogueSpider, FaultSpider
from tests.test_dlq import SCRAPY_HA, cli
from tests.test_retry_crawl import FAST_RETRIES

if TYPE_CHECKING:
    from pathlib import Path

#: path -> what becomes of it (FAST_RETRIES: 2 retries; a timeout and a 500 are retried)
PATHS = {
    "/item/1": "ok",
    "/item/2": "ok",
    "/status/404": "gone",
    "/status/410": "gone",
    "/flaky/1?fail=1&status=500": "ok",
    "/flaky/2?fail=9&status=503": "server",
    "/flaky/4?fail=1&status=timeout": "ok",
}


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


async def fault_crawl(redis_url: str, site) -> dict[str, float]:
    crawler = get_crawler(FaultSpider, {**FAST_RETRIES, "REDIS_URL": redis_url})
    paths = (*PATHS, "/item/1")  # the worker knows it sent this one: Redis never sees it
    await crawler.crawl_async(base_url=site.url, paths=paths)
    assert sorted(crawler.spider.ok) == sorted(p for p, v in PATHS.items() if v == "ok")
    return dict(crawler.stats.get_stats())


@deferred_f_from_coro_f
async def test_counters_after_a_crawl_with_retries_and_dead_letters(redis_url, redis_client, site):
    worker = await fault_crawl(redis_url, site)
    s = read_crawl_stats(redis_client, Keys("ha", "faults"))
    dlq = [
        json.loads(line) for line in cli(redis_url, "dlq", "export", "faults").stdout.splitlines()
    ]

    assert (s.enqueued, s.filtered) == (len(PATHS), 0)
    assert s.acked == sum(v == "ok" for v in PATHS.values()) == worker["item_scraped_count"]
    assert s.dead_lettered == len(dlq) == s.dead == 3
    assert s.dead_by_class == dict(Counter(e["class"] for e in dlq)) == {"gone": 2, "server": 1}
    assert s.enqueued == s.acked + s.dead_lettered + s.active and s.active == 0
    # every retry, counted once for the crawl and once by the worker that made it
    assert s.retried == worker["ha/retry/count"] == 1 + 2 + 1
    assert s.retried_by_class["server"] == 3 and sum(s.retried_by_class.values()) == 4
    assert (s.retry_ok, s.retry_dead) == (2, 1)
    assert s.domains == {
        "127.0.0.1": {"enqueued": 7, "acked": 4, "retried": 4, "dead": 3},
    }
    assert sum(s.minutes["acked"].values()) == 4 and sum(s.minutes["dead"].values()) == 3
    assert sum(s.minutes["enqueued"].values()) == 7 and sum(s.minutes["retried"].values()) == 4

    shown = json.loads(cli(redis_url, "status", "faults", "--json").stdout)
    assert shown["totals"] == {
        "enqueued": 7,
        "filtered": 0,
        "start_duplicates": 0,
        "acked": 4,
        "reclaimed": 0,
        "poison": 0,
        "retried": 4,
        "dead": 3,
        "retry_ok": 2,
        "retry_dead": 1,
        "requeued": 0,
        "purged": 0,
    }
    assert (shown["pending"], shown["dead"], shown["fingerprints"]) == (0, 3, 7)
    assert shown["dead_by_class"] == {"gone": 2, "server": 1}
    assert shown["retried_by_class"] == s.retried_by_class
    assert shown["retry_success_rate"] == pytest.approx(2 / 3)
    assert set(shown["rates"]) == {"acked", "enqueued", "retried", "dead"}
    assert shown["rates"]["acked"]["60m"] > 0 and set(shown["rates"]["acked"]) == {
        "1m",
        "5m",
        "60m",
    }
    assert shown["eta_seconds"] == 0.0  # nothing left
    assert shown["domains"] == [
        {"domain": "127.0.0.1", "enqueued": 7, "acked": 4, "retried": 4, "dead": 3}
    ]

    text = cli(redis_url, "status", "faults").stdout
    assert "retry success 66.7% (2 ok, 1 dead)" in text
    assert "dead-lettered  3 (gone 2, server 1)" in text
    assert "nothing left" in text and "127.0.0.1" in text


@deferred_f_from_coro_f
async def test_counters_after_a_catalogue_crawl_count_children(redis_url, redis_client, site):
    crawler = get_crawler(CatalogueSpider, {**FAST_RETRIES, "REDIS_URL": redis_url})
    await crawler.crawl_async(base_url=site.url)
    s = read_crawl_stats(redis_client, Keys("ha", "catalogue"))
    assert len(crawler.spider.items) == 50
    assert (s.enqueued, s.acked, s.filtered) == (55, 55, 0)  # 5 list pages, 50 items
    assert (s.retried, s.dead_lettered, s.reclaimed) == (0, 0, 0)
    assert s.retry_success_rate is None
    assert s.domains == {"127.0.0.1": {"enqueued": 55, "acked": 55}}
    # a second run of the crawl (its state kept): its start request is crawled again, as
    # Scrapy's re-run idiom does, and the 11 links of that page, seen in the first, are filtered
    again = get_crawler(CatalogueSpider, {**FAST_RETRIES, "REDIS_URL": redis_url})
    await again.crawl_async(base_url=site.url)
    s = read_crawl_stats(redis_client, Keys("ha", "catalogue"))
    assert (s.enqueued, s.acked, s.filtered, s.start_duplicates) == (56, 56, 11, 0)


#: Seconds a ``--watch`` test waits for refreshes, then for the exit after Ctrl-C.
WATCH_TIMEOUT = 60
#: The child dumps every thread's stack on SIGABRT: a hung command says where it hangs.
DUMP_ON_ABORT = {**os.environ, "PYTHONFAULTHANDLER": "1"}


def _watch(redis_url: str, *args: str, errors: Path) -> tuple[list[str], int]:
    """Runs ``status --watch`` until it printed two refreshes, then Ctrl-C."""
    command = [SCRAPY_HA, "--redis-url", redis_url, "status", "books", *args]
    lines: list[str] = []
    with (
        errors.open("w") as err,
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=err, text=True, env=DUMP_ON_ABORT
        ) as proc,
    ):
        # a command that never refreshes, or ignores Ctrl-C, fails with its stacks
        abort = threading.Timer(WATCH_TIMEOUT, _abort, (proc,))
        abort.start()
        assert proc.stdout is not None
        try:
            while sum(line.lstrip().startswith(("totals", "{")) for line in lines) < 2:
                line = proc.stdout.readline()
                if not line:
                    break
                lines.append(line)
            abort.cancel()
            proc.send_signal(signal.SIGINT)
            abort = threading.Timer(WATCH_TIMEOUT, _abort, (proc,))
            abort.start()
            lines += proc.stdout.readlines()
            proc.wait()
        finally:
            abort.cancel()
            _abort(proc)
    assert proc.returncode != -signal.SIGABRT, f"{lines}\n{errors.read_text()}"
    return lines, proc.returncode


def _abort(proc: subprocess.Popen) -> None:
    """SIGABRT a child still running (it dumps its stacks to stderr), then reap it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGABRT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_status_watch_refreshes_until_interrupted(redis_url, redis_client, tmp_path):
    redis_client.hset(Keys("ha", "books").stats, mapping={"enqueued": 3, "acked": 1})
    lines, code = _watch(redis_url, "--watch", "0.2", errors=tmp_path / "plain.err")
    assert code == 0
    headers = [line for line in lines if line.startswith("books at")]
    assert len(headers) >= 2 and "\x1b" not in "".join(lines)  # not a terminal: plain blocks
    assert sum("enqueued 3" in line for line in lines) == len(headers)

    lines, code = _watch(redis_url, "--watch", "0.2", "--json", errors=tmp_path / "json.err")
    assert code == 0
    acked = [json.loads(line)["totals"]["acked"] for line in lines]
    assert len(acked) >= 2 and set(acked) == {1}


def test_status_watch_ends_at_a_ctrl_c_at_any_moment(redis_url, redis_client):
    """40 runs of ``status --watch`` in one process, each stopped by a Ctrl-C at a random
    moment of its refresh loop (tests/watch_ctrl_c.py). Failed before the command watched
    for Ctrl-C itself: a cancellation lost in redis-py's ``asyncio.wait_for`` (Python 3.11)
    left it refreshing, in about one run in ten."""
    redis_client.hset(Keys("ha", "books").stats, mapping={"enqueued": 3, "acked": 1})
    run = subprocess.run(
        [sys.executable, "-m", "tests.watch_ctrl_c", redis_url, "books", "40"],
        capture_output=True,
        text=True,
        timeout=WATCH_TIMEOUT,
        check=False,
    )
    assert (run.returncode, run.stdout.strip()) == (0, "ended 40"), run.stderr[-3000:]


def test_status_of_a_crawl_with_counters_only(redis_url):
    """A crawl whose working keys were cleared still shows what it did."""
    client = redis.Redis.from_url(redis_url)
    client.hset(Keys("ha", "done").stats, mapping={"enqueued": 2, "acked": 2})
    shown = json.loads(cli(redis_url, "status", "done", "--json").stdout)
    assert (shown["totals"]["acked"], shown["pending"], shown["eta_seconds"]) == (2, 0, 0.0)
    assert cli(redis_url, "status", "done", "--watch", "0").returncode == 2


def test_status_watch_on_a_terminal_draws_over_the_last_screen(redis_url, redis_client, tmp_path):
    """On a terminal: the screen is cleared once, then each refresh goes back home and
    draws line by line over the last one (clearing each line's rest), so nothing flickers."""
    redis_client.hset(Keys("ha", "books").stats, mapping={"enqueued": 3, "acked": 1})
    main, child = pty.openpty()
    command = [SCRAPY_HA, "--redis-url", redis_url, "status", "books", "--watch", "0.2"]
    errors = tmp_path / "tty.err"
    with (
        errors.open("w") as err,
        subprocess.Popen(command, stdout=child, stderr=err, env=DUMP_ON_ABORT) as proc,
    ):
        os.close(child)
        out = b""
        deadline = time.monotonic() + WATCH_TIMEOUT
        while out.count(b"\x1b[H") < 3 and time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 1)
            if ready:
                out += os.read(main, 65536)
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=WATCH_TIMEOUT)
        except subprocess.TimeoutExpired:
            pass  # Ctrl-C ignored: the stacks say where it hangs
        finally:
            _abort(proc)
    os.close(main)
    assert proc.returncode == 0, f"{out!r}\n{errors.read_text()}"
    assert out.startswith(b"\x1b[2J\x1b[H") and out.count(b"\x1b[2J") == 1
    frames = out.split(b"\x1b[H")[1:3]
    assert len(frames) == 2 and all(b"enqueued 3" in frame for frame in frames)
    assert all(line.endswith(b"\x1b[K") for line in frames[0].split(b"\r\n")[:-1])
