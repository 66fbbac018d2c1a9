"""`scrapy-ha dashboard` logs each action it runs (``dashboard: requeued N of M (SPIDER,
requeue)``), as the metrics exporter logs what it finds: a QA run requeued 50,000 dead
letters through the dashboard and its log said nothing of it (the command left the
package's loggers without a handler, so their INFO lines were dropped; only uvicorn's own
lines were printed). An action on the crawl itself (pause, resume) is logged
without a count of entries. The console script in a subprocess, a real redis-server."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from scrapy_ha.demo import harness
from tests.cli_seed import dead_letters
from tests.test_dashboard_api import SCRAPY_HA
from tests.test_dashboard_restart import START_TIMEOUT, fetch, up

if TYPE_CHECKING:
    from pathlib import Path


def test_an_action_of_the_dashboard_is_in_its_log(redis_url: str, tmp_path: Path) -> None:
    dead_letters(redis_url, "shop", [(f"http://shop.example/{i}", "gone", 404) for i in range(3)])
    port = harness.free_port()
    log = tmp_path / "dashboard.log"
    with log.open("wb") as out:
        proc = harness.spawn(
            [SCRAPY_HA, "--redis-url", redis_url, "dashboard", "--port", str(port)],
            stdout=out,
            stderr=out,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            harness.wait_for(lambda: up(base), "the dashboard", START_TIMEOUT)
            body = json.dumps({"filter": {}, "all": True}).encode()
            status, text = fetch(base, "/api/crawls/shop/actions/requeue", body)
            assert status == 200, text
            assert json.loads(text)["touched"] == 3
            for _ in range(2):  # the second finds it paused already
                status, text = fetch(base, "/api/crawls/shop/actions/pause", b"{}")
                assert status == 200, text
        finally:
            harness.stop(proc)
    said = log.read_text()
    assert "dashboard: requeued 3 of 3 (shop, requeue)" in said, said
    assert said.count("Application startup complete") == 1, said  # uvicorn's, not twice
    # an action on the crawl itself names no entries ("paused 1 of 0" before)
    assert "dashboard: paused shop\n" in said, said
    assert "dashboard: paused shop (already)\n" in said, said
    assert " of 0 " not in said, said
