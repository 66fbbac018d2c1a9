"""A worker that starts while its Redis is not there yet waits for it, as a running worker
does, up to HA_START_TIMEOUT: real ``scrapy crawl`` processes, a real redis-server started
after them (or never)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from scrapy_ha.demo.harness import free_port
from tests import redis_servers
from tests.test_crash import count_lines, wait_for_log, worker

if TYPE_CHECKING:
    from pathlib import Path
    from subprocess import Popen

#: What a worker logs at each attempt while it waits (the URL's password masked).
WAITING = "unreachable at start"


def started_after_waits(log: Path, waiting: Popen[bytes], tmp_path: Path, port: int) -> Any:
    """A redis-server (password ``hunter2``) on *port*, started once the process *waiting*
    logged that it waits for it, and then that it tried again and again."""
    wait_for_log(log, f"{WAITING} (", waiting)
    wait_for_log(log, "attempt 3,", waiting)
    return redis_servers.start(
        tmp_path / "redis", "--requirepass", "hunter2", port=port, password="hunter2"
    )


def test_a_worker_started_before_its_redis_waits_for_it_and_crawls_everything(
    site_factory, tmp_path: Path
):
    port = free_port()
    url = f"redis://:hunter2@127.0.0.1:{port}/0"
    site = site_factory("--pages", "5", "--per-page", "10")
    items, log = tmp_path / "items.jl", tmp_path / "worker.log"
    early = worker(url, site.url, items, log)  # HA_START_TIMEOUT: its default, 60 s
    server = None
    try:
        server = started_after_waits(log, early, tmp_path, port)
        assert early.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if server is not None:
            server.kill()
    assert count_lines(items) == 50
    text = log.read_text()
    assert f"Redis at redis://:***@127.0.0.1:{port}/0 {WAITING}" in text
    assert "hunter2" not in text and "'finish_reason': 'finished'" in text


def test_a_worker_whose_redis_never_comes_fails_after_the_start_timeout(
    site_factory, tmp_path: Path
):
    port = free_port()
    url = f"redis://:hunter2@127.0.0.1:{port}/0"
    log = tmp_path / "worker.log"
    alone = worker(url, "http://127.0.0.1:9", tmp_path / "items.jl", log, HA_START_TIMEOUT="2")
    assert alone.wait(timeout=120) == 1  # Scrapy's exit code for a crawl that could not start
    text = log.read_text()
    masked = f"redis://:***@127.0.0.1:{port}/0"
    waits = re.findall(rf"WARNING: Redis at {re.escape(masked)} {WAITING} \(ConnectionError", text)
    assert len(waits) >= 2, text[-3000:]
    (error,) = [line for line in text.splitlines() if " ERROR: " in line]
    assert f"cannot reach Redis at {masked} within HA_START_TIMEOUT=2s" in error
    assert "'finish_reason': 'ha_start_failed'" in text and "hunter2" not in text
