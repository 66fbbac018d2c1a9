"""A real `scrapy crawl` whose archive database freezes (a real PostgreSQL stopped with
SIGSTOP: it accepts bytes and never answers) while the worker archives: the crawl goes on,
the worker still exits once its close gave up on the copies, and `scrapy-ha dlq archive`
copies what it could not, each dead letter once. The command itself stops on Ctrl-C when
the database freezes under it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest
import sqlalchemy

from scrapy_ha.demo.harness import wait_for
from scrapy_ha.keys import Keys
from tests.cli_seed import SCRAPY_HA
from tests.test_crash import EXAMPLE, FAST_LEASES
from tests.test_dlq import cli

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    import redis

    from tests._postgres import PostgresServer

KEYS = Keys("ha", "catalogue")
#: The archive's wait at close, shortened in the worker (30 s) so that the test is short.
CLOSE_WAIT = 2
#: Seconds a worker has to exit once the crawl is done: its close, the archive's wait.
EXIT_TIMEOUT = 60


def postgres_pids(server: PostgresServer) -> list[int]:
    """The postmaster and its backends: all of them stopped is a frozen server."""
    with open(os.path.join(server.data, "postmaster.pid")) as f:
        main = int(f.readline())
    found = subprocess.run(["ps", "-o", "pid=", "--ppid", str(main)], capture_output=True)
    return [main, *map(int, found.stdout.split())]


@contextlib.contextmanager
def frozen(server: PostgresServer) -> Iterator[None]:
    """The server's postmaster and backends stopped (SIGSTOP) until the block ends."""
    pids = postgres_pids(server)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # a backend that ended since
            os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        # the backends first: a backend that was ending when listed (the test's own last
        # query's) is reaped by the postmaster once it runs, and its pid is then gone
        for pid in reversed(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def exited(proc: subprocess.Popen) -> int | None:
    """*proc*'s exit code, or None if it did not exit within :data:`EXIT_TIMEOUT`."""
    try:
        return proc.wait(timeout=EXIT_TIMEOUT)
    except subprocess.TimeoutExpired:
        return None


def frozen_worker(redis_url: str, site_url: str, archive_url: str, log: Path) -> subprocess.Popen:
    patch = f"import scrapy_ha.deadletters.archiver as a; a.CLOSE_TIMEOUT = {CLOSE_WAIT}"
    args = [sys.executable, "-c", f"{patch}; from scrapy.cmdline import execute; execute()"]
    args += ["crawl", "catalogue", "-a", f"base_url={site_url}"]
    settings = {**FAST_LEASES, "REDIS_URL": redis_url, "HA_DLQ_ARCHIVE_URL": archive_url}
    for name, value in {**settings, "LOG_LEVEL": "INFO", "CONCURRENT_REQUESTS": "4"}.items():
        args += ["-s", f"{name}={value}"]
    env = {**os.environ, "PYTHONPATH": str(EXAMPLE.parent)}
    with log.open("wb") as out:
        return subprocess.Popen(args, cwd=EXAMPLE, env=env, stdout=out, stderr=subprocess.STDOUT)


def archived_ids(url: str) -> list[str]:
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as conn:
            query = "SELECT entry_id FROM scrapy_ha_dead_letters"
            return [r[0] for r in conn.execute(sqlalchemy.text(query))]
    except sqlalchemy.exc.ProgrammingError:  # no table yet
        return []
    finally:
        engine.dispose()


@pytest.mark.usefixtures("fast_engine_heartbeat")
def test_a_worker_exits_though_its_archive_database_froze(
    redis_url: str,
    redis_client: redis.Redis,
    site_factory,
    postgres_server: PostgresServer,
    postgres_url: str,
    tmp_path: Path,
) -> None:
    # every third item page is gone for good: dead-lettered at once
    site = site_factory("--pages", "30", "--per-page", "10", "--fault", "404:3:1000000")
    log = tmp_path / "worker.log"
    proc = frozen_worker(redis_url, site.url, postgres_url, log)
    wait_for(lambda: archived_ids(postgres_url) or proc.poll(), "a first row", 60)
    with frozen(postgres_server):  # with the worker's backend
        returncode = exited(proc)
    text = log.read_text()
    assert returncode == 0, f"the worker did not exit: {text[-2000:]}"
    assert "'finish_reason': 'finished'" in text
    assert "dead letter(s) of catalogue were not archived at close" in text

    dead = {m.decode() for m in redis_client.zrange(KEYS.dead, 0, -1)}
    assert len(dead) == 100  # 300 items, every third gone
    copied = cli(redis_url, "dlq", "archive", "catalogue", "--url", postgres_url)
    assert copied.returncode == 0, copied.stderr
    rows = archived_ids(postgres_url)
    assert sorted(rows) == sorted(dead)  # each dead letter once


def seed_dead_letters(client: redis.Redis, keys: Keys, n: int) -> None:
    client.hset(keys.stats, "enqueued", n)  # the crawl is there
    info = json.dumps({"class": "gone", "reason": "HTTP 404", "status": 404})
    pipe = client.pipeline(transaction=False)
    for i in range(1, n + 1):
        pipe.zadd(keys.dead, {str(i): 5000 + i})
        pipe.hset(keys.dead_info, str(i), info)
        pipe.hset(keys.payload, str(i), json.dumps({"v": 1, "u": f"http://a.test/{i}"}))
    pipe.execute()


def test_dlq_archive_stops_on_ctrl_c_when_the_database_freezes(
    redis_url: str,
    redis_client: redis.Redis,
    postgres_server: PostgresServer,
    postgres_url: str,
) -> None:
    """A QA run: frozen mid-copy, the command ignored two SIGINTs (Python waited for the
    thread that waited for the database), and only SIGKILL ended it."""
    keys = Keys("ha", "faults")
    seed_dead_letters(redis_client, keys, 20_000)  # 40 batches: the freeze comes mid-copy
    command = [SCRAPY_HA, "--redis-url", redis_url, "dlq", "archive", "faults"]
    proc = subprocess.Popen([*command, "--url", postgres_url], stderr=subprocess.DEVNULL)
    wait_for(lambda: archived_ids(postgres_url) or proc.poll() is not None, "rows", 60)
    assert proc.poll() is None, "the copy ended before the freeze"
    with frozen(postgres_server):  # with the command's backend
        proc.send_signal(signal.SIGINT)
        returncode = exited(proc)
    assert returncode is not None, "Ctrl-C did not stop the command"

    # what it copied is marked, the rest copied now: each dead letter once
    again = cli(redis_url, "dlq", "archive", "faults", "--url", postgres_url)
    assert again.returncode == 0, again.stderr
    assert sorted(archived_ids(postgres_url), key=int) == [str(i) for i in range(1, 20_001)]
