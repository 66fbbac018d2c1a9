"""The dashboard and the metrics exporter name the Redis that stopped answering, password
masked, as the CLI's commands and the workers do (a QA run behind Sentinel: the dashboard's
503 read "Redis did not answer (ConnectionError: Error 111 connecting to 127.0.0.1:42397
...)" and the exporter logged "Redis unreachable": neither said which Redis, nor whether the
address in the error was the URL given or the primary the sentinels named). The console
scripts in subprocesses, a real redis-server with a password, SIGKILLed."""

from __future__ import annotations

import json
import subprocess
import time
from typing import TYPE_CHECKING
from urllib.request import urlopen

from scrapy_ha.demo import harness
from tests import redis_servers
from tests.test_dashboard_api import SCRAPY_HA
from tests.test_dashboard_restart import START_TIMEOUT, fetch, up
from tests.test_metrics import Exporter, _first_line

if TYPE_CHECKING:
    from pathlib import Path

PASSWORD = "s3cret"


def _server(tmp_path: Path) -> tuple[redis_servers.Server, str]:
    server = redis_servers.start(tmp_path / "redis", "--requirepass", PASSWORD, password=PASSWORD)
    return server, f"redis://:{PASSWORD}@127.0.0.1:{server.port}/0"


def test_the_dashboard_names_the_redis_that_does_not_answer(tmp_path: Path):
    server, url = _server(tmp_path)
    port = harness.free_port()
    proc = harness.spawn([SCRAPY_HA, "--redis-url", url, "dashboard", "--port", str(port)])
    base = f"http://127.0.0.1:{port}"
    try:
        harness.wait_for(lambda: up(base), "the dashboard", START_TIMEOUT)
        server.kill()
        status, text = fetch(base, "/api/crawls")
        error = json.loads(text)["error"]
        assert status == 503, text
        assert error.startswith(f"Redis at redis://:***@127.0.0.1:{server.port}/0 did not answer")
        status, page = fetch(base, "/")
        assert status == 503 and f"127.0.0.1:{server.port}/0 did not answer" in page, page
        assert PASSWORD not in error + page
    finally:
        harness.stop(proc)
        if server.proc.poll() is None:
            server.kill()


def test_the_exporter_logs_which_redis_does_not_answer(tmp_path: Path):
    server, url = _server(tmp_path)
    log = tmp_path / "exporter.log"
    with log.open("wb") as err:
        exporter = Exporter.__new__(Exporter)
        exporter.proc = harness.spawn(
            [SCRAPY_HA, "metrics", "--port", "0", "--redis-url", url],
            stdout=subprocess.PIPE,
            stderr=err,
        )
        try:
            line = _first_line(exporter.proc, START_TIMEOUT)
            exporter.url = line.split()[1]
            server.kill()
            with urlopen(exporter.url, timeout=START_TIMEOUT) as answer:
                assert "scrapy_ha_redis_up 0.0" in answer.read().decode()
            deadline = time.monotonic() + START_TIMEOUT
            while "unreachable" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.05)  # the scrape answered: its line is on its way to the file
            text = log.read_text()
            assert f"Redis at redis://:***@127.0.0.1:{server.port}/0 unreachable" in text, text
            assert PASSWORD not in text
        finally:
            exporter.stop()
            if server.proc.poll() is None:
                server.kill()
