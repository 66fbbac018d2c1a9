"""An action Redis stopped answering mid-way says it may have been done, in part or whole
(it said "did not answer; reload once it is back", as a page does, though what it sent may
have run, and a reload posts the form again): the page and the API tell the operator to look
at the crawl before acting again. A real redis-server frozen with SIGSTOP as the purge is
sent."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import TYPE_CHECKING

from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.store.queue import RedisQueue
from tests import redis_servers
from tests.test_dashboard_actions import dead_ids, dead_letters
from tests.test_dashboard_api import dashboard, form_token

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

#: Seconds the dashboard's Redis client waits for an answer (its default is 15).
TIMEOUT = 1


@deferred_f_from_coro_f
async def test_an_action_redis_did_not_answer_may_have_been_done(tmp_path: Path, monkeypatch):
    server = redis_servers.start(tmp_path / "redis")
    url = f"redis://127.0.0.1:{server.port}/0"
    await dead_letters(url, "shop", 2)
    freeze(monkeypatch, server.proc.pid)
    try:
        await asyncio.to_thread(_check, url, server)
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        server.kill()


def freeze(monkeypatch: pytest.MonkeyPatch, pid: int) -> None:
    """Redis freezes as each purge is sent to it."""
    purge = RedisQueue.purge_dead

    async def frozen(self: RedisQueue, ids: list[str]) -> tuple[int, int]:
        os.kill(pid, signal.SIGSTOP)
        return await purge(self, ids)

    monkeypatch.setattr(RedisQueue, "purge_dead", frozen)


def _check(url: str, server: redis_servers.Server) -> None:
    with dashboard(f"{url}?socket_timeout={TIMEOUT}") as http:
        ids = sorted(dead_ids(http, "shop"))
        csrf = form_token(http.get("/crawls/shop/dead").text)
        form = {"csrf": csrf, "confirm": "yes", "ids": ids[:1]}
        page = http.post("/crawls/shop/actions/purge", data=form)
        os.kill(server.proc.pid, signal.SIGCONT)
        assert page.status_code == 503, page.text
        assert "did not answer" in page.text
        # before: "reload once it is back" (a reload posts the form again), nothing more
        assert "the purge may have been done, in part or whole" in page.text, page.text
        assert "look at the crawl's tables before acting again" in page.text
        api = http.post("/api/crawls/shop/actions/purge", json={"ids": ids[1:]})
        os.kill(server.proc.pid, signal.SIGCONT)
        assert api.status_code == 503
        assert "the purge may have been done" in json.loads(api.text)["error"]
        assert dead_ids(http, "shop") <= set(ids)  # awake: the tables say what was done
