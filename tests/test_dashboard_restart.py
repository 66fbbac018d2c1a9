"""`scrapy-ha dashboard` across a restart of Redis: once Redis answers again, so does every
page and action (a QA run: every other request was a 503 "Redis did not answer", each
connection of the pool that lived through the restart failing its next command once);
while Redis is down, a 503 at once. The console script in a subprocess, a real
redis-server killed and started again on its port."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.demo import harness
from tests import redis_servers
from tests.test_dashboard_api import SCRAPY_HA, delay_one

if TYPE_CHECKING:
    from pathlib import Path

#: Seconds the dashboard gets to start, and one request to be answered, on a loaded machine.
START_TIMEOUT = 60.0
#: Requests made at once: each takes a connection of the pool (and /api/crawls several).
AT_ONCE = 6


def fetch(base: str, path: str, body: bytes | None = None) -> tuple[int, str]:
    """The status and text of a GET of *path* (a JSON POST with *body*)."""
    headers = {"content-type": "application/json"} if body is not None else {}
    request = urllib.request.Request(base + path, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=START_TIMEOUT) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def at_once(base: str, paths: list[str]) -> list[int]:
    with ThreadPoolExecutor(AT_ONCE) as pool:
        return [status for status, _ in pool.map(lambda p: fetch(base, p), paths)]


def up(base: str) -> bool:
    try:
        return fetch(base, "/api/crawls")[0] == 200
    except OSError:
        return False


@deferred_f_from_coro_f
async def test_every_request_is_answered_once_a_restarted_redis_is_back(tmp_path: Path):
    server = redis_servers.start(tmp_path / "redis")
    url = f"redis://127.0.0.1:{server.port}/0"
    await delay_one(url, "http://shop.example/item/1", 600_000)
    port = harness.free_port()
    proc = harness.spawn([SCRAPY_HA, "--redis-url", url, "dashboard", "--port", str(port)])
    base = f"http://127.0.0.1:{port}"
    try:
        harness.wait_for(lambda: up(base), "the dashboard", START_TIMEOUT)
        paths = ["/api/crawls", "/api/crawls/slow"] * AT_ONCE
        assert at_once(base, paths) == [200] * len(paths)  # the pool holds several now

        server.kill()  # nothing asks while it is down: every pooled connection is closed
        server = redis_servers.start(tmp_path / "redis", port=server.port)
        await delay_one(url, "http://shop.example/item/2", 600_000)  # (it kept nothing)

        paused = fetch(base, "/api/crawls/slow/actions/pause", b"{}")
        assert paused[0] == 200, paused
        assert json.loads(paused[1])["report"] == "paused"
        assert [fetch(base, p)[0] for p in paths] == [200] * len(paths)
        assert at_once(base, paths) == [200] * len(paths)

        server.kill()  # down: a 503 that says so, not a wait
        status, text = fetch(base, "/api/crawls")
        assert status == 503 and "did not answer" in json.loads(text)["error"]
    finally:
        harness.stop(proc)
        if server.proc.poll() is None:
            server.kill()
