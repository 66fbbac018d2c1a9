"""A worker stopped (Ctrl-C, SIGTERM, scrapyd's cancel) before its crawl runs closes the
crawl before it exits: real ``scrapy crawl`` processes, real redis-servers (one that holds
every write: ``CLIENT PAUSE WRITE``), every kind of Scrapy process. Scrapy stops its
reactor at once while the engine is not running: the crawl was abandoned mid-open (exit
code 0, nothing logged), held 10 s by a Redis call that hung, or (without a reactor) not
stopped at all."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

import pytest
from pydispatch.dispatcher import getAllReceivers
from scrapy import signals
from scrapy.utils.defer import deferred_f_from_coro_f, maybe_deferred_to_future
from scrapy.utils.test import get_crawler

from scrapy_ha.demo.harness import free_port, wait_for
from tests import redis_servers
from tests.spiders import CatalogueSpider
from tests.test_compact_readers import crawl_settings
from tests.test_crash import EXAMPLE, wait_for_log, worker

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

#: Seconds a stopped worker may take to exit (a loaded machine): its end is what is
#: waited for; the bound only fails a worker that does not stop.
STOPPED_WITHIN = 30
#: Settings of each kind of Scrapy process.
PROCESSES = {
    "async": {},
    "deferred": {"FORCE_CRAWLER_PROCESS": "True"},
    "reactorless": {"TWISTED_REACTOR_ENABLED": "False"},
}
#: How the spider's close shows in the log (Scrapy's own lines: the stats, the close).
CLOSED = "Spider closed ({})"


def ended(proc: subprocess.Popen[bytes]) -> int:
    try:
        return proc.wait(timeout=STOPPED_WITHIN)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def scrapy_ha_errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if " [scrapy_ha." in line and " ERROR: " in line]


@contextlib.contextmanager
def writes_held(server: redis_servers.Server) -> Iterator[None]:
    """Redis answers reads, and holds every write (a script too) until the block ends."""
    with server.client() as client:
        client.execute_command("CLIENT", "PAUSE", 120_000, "WRITE")
        try:
            yield
        finally:
            client.execute_command("CLIENT", "UNPAUSE")


def held_write(server: redis_servers.Server) -> bool:
    """Whether a client waits on a write Redis holds (CLIENT PAUSE WRITE)."""
    with server.client() as client:
        return any("b" in c["flags"] and c["cmd"] != "client|list" for c in client.client_list())


@pytest.mark.parametrize("kind", list(PROCESSES))
def test_a_worker_stopped_while_its_redis_stopped_answering_closes_as_a_failed_start(
    tmp_path: Path, kind: str
):
    """Redis answered, then a start step's write hung on it: the stop came, the shutdown
    waited 10 s for the step, a second Ctrl-C could not end it, and the worker exited
    with 0 without a word."""
    server = redis_servers.start(tmp_path / "redis")
    url = f"redis://127.0.0.1:{server.port}/0"
    log = tmp_path / "worker.log"
    try:
        with writes_held(server):
            proc = worker(url, "http://127.0.0.1:9", tmp_path / "items.jl", log, **PROCESSES[kind])
            wait_for(lambda: held_write(server) or proc.poll() is not None, "a held write", 60)
            proc.send_signal(signal.SIGINT)
            code = ended(proc)
    finally:
        server.kill()
    text = log.read_text()
    assert code == 1, text[-3000:]
    (error,) = scrapy_ha_errors(text)
    assert f"scrapy-ha stopped before its start at Redis at {url} was done: the stop came" in error
    assert CLOSED.format("ha_start_failed") in text


@pytest.mark.parametrize("kind", ["async", "deferred"])
def test_a_second_ctrl_c_ends_the_wait_for_a_close_at_once(tmp_path: Path, kind: str):
    """The hold of the shutdown (until the crawl stopped at start has closed) ends on the
    second Ctrl-C, as Scrapy's "forcing unclean shutdown" says, with an ERROR line, and
    ``scrapy crawl`` exits with 1 (before: 0, as if the crawl had run); under the
    Deferred-based CrawlerProcess with 0 still, and no traceback."""
    server = redis_servers.start(tmp_path / "redis")
    url = f"redis://127.0.0.1:{server.port}/0"
    log = tmp_path / "worker.log"
    try:
        with writes_held(server):
            proc = worker(url, "http://127.0.0.1:9", tmp_path / "items.jl", log, **PROCESSES[kind])
            wait_for(lambda: held_write(server) or proc.poll() is not None, "a held write", 60)
            proc.send_signal(signal.SIGINT)
            wait_for_log(log, "shutting down gracefully", proc)
            proc.send_signal(signal.SIGINT)
            code = ended(proc)
    finally:
        server.kill()
    text = log.read_text()
    assert code == (1 if kind == "async" else 0), text[-3000:]
    assert "forcing unclean shutdown" in text and "Traceback" not in text
    (error,) = scrapy_ha_errors(text)
    assert f"the crawl at Redis at {url} did not close before a second stop came" in error


@pytest.mark.parametrize("kind", list(PROCESSES))
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_worker_stopped_while_it_waits_for_redis_closes_as_a_failed_start(
    tmp_path: Path, kind: str, sig: int
):
    """Without a reactor the stop was not seen (the wait ran to HA_START_TIMEOUT); with the
    Deferred-based CrawlerProcess the reactor stopped mid-close (exit code 0, no stats)."""
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    log = tmp_path / "worker.log"
    proc = worker(url, "http://127.0.0.1:9", tmp_path / "items.jl", log, **PROCESSES[kind])
    wait_for_log(log, "unreachable at start (", proc)
    proc.send_signal(sig)
    code = ended(proc)
    text = log.read_text()
    assert code == 1, text[-3000:]
    (error,) = scrapy_ha_errors(text)
    masked = url.replace("hunter2", "***")
    assert f"scrapy-ha stopped before it reached Redis at {masked}: a stop came" in error
    # (the logger its WARNINGs always had: a filter on it keeps working)
    assert f"[scrapy_ha.scheduler.session.connect] WARNING: Redis at {masked} unreachable" in text
    assert "'finish_reason': 'ha_start_failed'" in text and CLOSED.format("ha_start_failed") in text
    assert "hunter2" not in text


@pytest.mark.parametrize("kind", list(PROCESSES))
def test_a_worker_without_item_pipelines_stopped_in_its_start_wait_exits_with_1(
    tmp_path: Path, kind: str
):
    """Scrapy 2.16's Deferred-based CrawlerProcess (``FORCE_CRAWLER_PROCESS``) starts the
    engine after an open that a stop cut short, and counts the crawl as failed only once
    that start has returned; the shutdown's hold ended once the crawl had closed, before
    it: the reactor stopped first, Scrapy never counted the crawl, and ``scrapy crawl``
    exited with 0 after logging ``ha_start_failed`` (a QA run: 0 in 4 of 4 stops, SIGINT
    and SIGTERM). The example project's pipeline, slower to close, hid it from the test
    above; a project without item pipelines is the plain case."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    log = tmp_path / "worker.log"
    bare = {"ITEM_PIPELINES": "{}", **PROCESSES[kind]}
    proc = worker(url, "http://127.0.0.1:9", tmp_path / "items.jl", log, **bare)
    wait_for_log(log, "unreachable at start (", proc)
    proc.send_signal(signal.SIGTERM)
    code = ended(proc)
    text = log.read_text()
    assert code == 1, text[-3000:]
    assert CLOSED.format("ha_start_failed") in text and "Traceback" not in text


@pytest.mark.parametrize("kind", ["async", "deferred"])
def test_a_worker_stopped_before_its_engine_runs_closes_and_leaves_redis(
    redis_url, redis_client, tmp_path: Path, kind: str
):
    """Stopped once the scheduler had opened, while a spider_opened handler still ran: the
    reactor stopped at once, the spider never closed, its heartbeat stayed in Redis."""
    release, log = tmp_path / "release", tmp_path / "worker.log"
    slow = {
        "EXTENSIONS": json.dumps({"tests.slow_open.SlowOpen": 0}),
        "SLOW_OPEN_FILE": str(release),
    }
    proc = worker(
        redis_url, "http://127.0.0.1:9", tmp_path / "items.jl", log, **slow, **PROCESSES[kind]
    )
    wait_for_log(log, "slow open: holding", proc)
    assert redis_client.keys("*workers*")  # joined: its heartbeat is there
    proc.send_signal(signal.SIGINT)
    wait_for_log(log, "shutting down gracefully", proc)
    release.touch()
    code = ended(proc)
    text = log.read_text()
    assert code == 0, text[-3000:]  # a stop of a crawl that had started, as mid-crawl
    assert CLOSED.format("shutdown") in text and not scrapy_ha_errors(text)
    assert not redis_client.keys("*workers*")  # it left the crawl


#: A worker as ``scrapy crawl`` runs it, where Twisted's deprecation warnings are shown
#: (Scrapy filters them out).
SHOWING_WARNINGS = """
import sys, warnings
from scrapy.crawler import AsyncCrawlerProcess
from scrapy.utils.project import get_project_settings
settings = get_project_settings()
settings.set("REDIS_URL", sys.argv[1], priority="cmdline")
process = AsyncCrawlerProcess(settings)
process.crawl("catalogue", base_url="http://127.0.0.1:9")
warnings.filterwarnings("always", "Removing already-fired")
process.start()
sys.exit(1 if process.bootstrap_failed else 0)
"""


def test_a_stop_at_start_removes_no_trigger_of_the_reactor_that_fired(tmp_path: Path):
    """Twisted: "Removing already-fired system event triggers will raise an exception in a
    future version", at every stop during the start wait."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    log = tmp_path / "worker.log"
    env = {**os.environ, "PYTHONPATH": str(EXAMPLE.parent)}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", SHOWING_WARNINGS, url],
            cwd=EXAMPLE,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    wait_for_log(log, "unreachable at start (", proc)
    proc.send_signal(signal.SIGINT)
    code = ended(proc)
    text = log.read_text()
    assert code == 1, text[-3000:]
    assert "Removing already-fired" not in text


@deferred_f_from_coro_f
async def test_a_crawl_no_stop_came_to_keeps_nothing_of_the_watch(redis_url, site):
    """The common case: a crawl that Redis answered at once and that no stop came to keeps,
    once its engine ran, neither the watch's handler of ``engine_started`` nor its
    ``stop_async`` on the crawler (a review: the handler stayed connected for the whole
    crawl). Its watch of the engine's close stays (a call per close): a start that fails
    closes the spider before the reactor's shutdown, whose hold must see it closed."""
    crawler = get_crawler(CatalogueSpider, crawl_settings(redis_url))
    await crawler.crawl_async(base_url=site.url)
    assert crawler.stats.get_value("finish_reason") == "finished"
    receivers = getAllReceivers(crawler.signals.sender, signals.engine_started)
    assert [r for r in receivers if "StopAtStart" in repr(r)] == []
    assert "stop_async" not in vars(crawler)


@deferred_f_from_coro_f
async def test_a_scheduler_closed_before_its_engine_ran_leaves_no_hold_of_the_shutdown(
    redis_url,
):
    """A scheduler opened and closed without the engine running it (Scrapy's scheduler
    tests, run with scrapy-ha; a tool that drives one): its watch of the start ends with
    its close (before: the reactor's shutdown trigger stayed, and at the process's exit
    each held it 10 s and logged that the crawl "did not close")."""
    from unittest.mock import Mock

    from twisted.internet import reactor

    from scrapy_ha import Scheduler

    crawler = get_crawler(CatalogueSpider, crawl_settings(redis_url))
    crawler.engine = Mock()
    scheduler = Scheduler.from_crawler(crawler)
    await maybe_deferred_to_future(scheduler.open(CatalogueSpider.from_crawler(crawler)))
    await maybe_deferred_to_future(scheduler.close("finished"))
    before = reactor._eventTriggers["shutdown"].before  # type: ignore[attr-defined]
    assert [t for t in before if "StopAtStart" in repr(t[0])] == []
