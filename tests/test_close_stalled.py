"""Stopping a worker while its Redis stalls (a real redis-server frozen with SIGSTOP: it
accepts connections and never answers): the close gives up within ``HA_CLOSE_TIMEOUT``,
says why, and loses nothing (its leases expire and a second worker finishes the crawl)."""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING

from scrapy_ha.scheduler.session.closing import TEARDOWN_TIMEOUT
from scrapy_ha.store.url import DEFAULT_SOCKET_TIMEOUT
from tests import redis_servers
from tests.test_crash import PER_KILL, check_nothing_lost, wait_for_items, worker

if TYPE_CHECKING:
    from pathlib import Path

#: The close's budget in this test: short, so that it stands out from one Redis call's
#: socket timeout (15 s), which is what any wait on a silent Redis not bounded by it costs.
CLOSE_TIMEOUT = 2
#: Checkpoints saved at page ends only: a page run again reads none, so no callback waits
#: on Redis in the middleware (such a read is bounded by the socket timeout, as mid-crawl).
SETTINGS = {"HA_CLOSE_TIMEOUT": str(CLOSE_TIMEOUT), "HA_CHECKPOINT_ITEMS": "0"}


def test_stopping_a_worker_while_redis_stalls_gives_up_in_time_and_loses_nothing(
    site_factory, tmp_path: Path
):
    server = redis_servers.start(tmp_path / "redis")
    url = f"redis://127.0.0.1:{server.port}/0"
    pages, per_page = 60, 20
    site = site_factory(
        "--pages", str(pages), "--per-page", str(per_page), "--delay", "0.05", "--chains", "4"
    )
    items, log = tmp_path / "items.jl", tmp_path / "first.log"
    first = worker(url, site.url, items, log, **SETTINGS)
    try:
        wait_for_items(items, 200, first)
        server.proc.send_signal(signal.SIGSTOP)  # accepts connections, never answers
        first.send_signal(signal.SIGINT)  # what scrapyd's cancel sends
        started = time.monotonic()
        assert first.wait(timeout=120) == 0
        took = time.monotonic() - started
    finally:
        server.proc.send_signal(signal.SIGCONT)
    text = log.read_text()
    assert "'finish_reason': 'shutdown'" in text
    assert f"at close (Redis made no progress for HA_CLOSE_TIMEOUT={CLOSE_TIMEOUT}s)" in text
    assert "at close ()" not in text
    # the budget, the teardown and the process's own exit: well short of one socket timeout
    assert took < CLOSE_TIMEOUT + TEARDOWN_TIMEOUT + DEFAULT_SOCKET_TIMEOUT / 2, took

    second = worker(url, site.url, items, tmp_path / "second.log")
    try:
        assert second.wait(timeout=180) == 0, (tmp_path / "second.log").read_text()[-3000:]
    finally:
        server.kill()
    check_nothing_lost(items, pages * per_page, site.hits(), bound=PER_KILL)
