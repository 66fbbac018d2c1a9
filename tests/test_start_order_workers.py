"""Start requests are enqueued once per run whatever order each worker's ``start()`` yields
them in: two real ``scrapy crawl`` workers whose ``start_urls`` come from a set (its order
is Python's hash order, which differs per process with ``PYTHONHASHSEED``)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from scrapy_ha.demo import harness
from scrapy_ha.keys import Keys
from tests.cli_seed import scrapy_ha
from tests.scrapy_project import crawl, write_project

if TYPE_CHECKING:
    import subprocess
    from pathlib import Path

ITEMS = 40
SPIDER = f"""
import scrapy


class Unordered(scrapy.Spider):
    name = "unordered"

    def __init__(self, base_url="", **kwargs):
        super().__init__(**kwargs)
        # a set's order: Python's string hashes, salted per process (PYTHONHASHSEED)
        self.start_urls = list({{f"{{base_url}}/item/{{i}}" for i in range(1, {ITEMS} + 1)}})
        order = " ".join(url.rsplit("/", 1)[1] for url in self.start_urls)
        self.logger.info("start order: %s", order)

    def parse(self, response):
        yield {{"url": response.url}}
"""
#: Short leases and idle timeout: the crawl is small.
FAST = {
    "HA_LEASE_TIME": "3",
    "HA_LEASE_RENEW_INTERVAL": "1",
    "HA_HEARTBEAT_TTL": "3",
    "HA_IDLE_TIMEOUT": "1",
}
#: Seconds a worker may go without the progress awaited (start-up of two Python processes
#: on a loaded 2-core machine takes a few).
PATIENCE = 120


def _start_order(log: Path) -> str:
    match = re.search(r"start order: ([\d ]+)", log.read_text())
    return match[1] if match else ""


def _seeded(redis_client: object, keys: Keys, workers: list[subprocess.Popen[bytes]]) -> bool:
    """Both workers' start requests reached Redis (each enqueued, or a duplicate start)."""
    assert all(w.poll() is None for w in workers), "a worker ended while the crawl was paused"
    stats = redis_client.hgetall(keys.stats)  # type: ignore[attr-defined]
    return int(stats.get(b"enqueued", 0)) + int(stats.get(b"start_duplicates", 0)) >= 2 * ITEMS


def test_start_requests_are_enqueued_once_whatever_order_each_worker_yields_them_in(
    tmp_path, redis_url, redis_client, site_factory
):
    site = site_factory("--pages", "4", "--per-page", "10")
    project = write_project(tmp_path / "project", "unordered_project", SPIDER)
    keys = Keys("ha", "unordered")
    # paused: both workers seed the crawl while it is alive, whatever their start-up times
    paused = scrapy_ha("pause", "unordered", "--create", "--redis-url", redis_url)
    assert paused.returncode == 0, paused.stderr
    logs = [tmp_path / f"worker{seed}.log" for seed in (1, 2)]
    workers = [
        crawl(
            project,
            "unordered",
            log,
            args={"base_url": site.url},
            settings={**FAST, "REDIS_URL": redis_url},
            env={"PYTHONHASHSEED": str(seed)},
        )
        for seed, log in zip((1, 2), logs, strict=True)
    ]
    harness.wait_for(
        lambda: _seeded(redis_client, keys, workers), "both workers' start requests", PATIENCE
    )
    orders = [_start_order(log) for log in logs]
    assert orders[0] and orders[1] and orders[0] != orders[1], orders
    assert scrapy_ha("resume", "unordered", "--redis-url", redis_url).returncode == 0
    for worker, log in zip(workers, logs, strict=True):
        assert worker.wait(timeout=PATIENCE) == 0, log.read_text()[-3000:]
    hits = site.hits()
    assert {f"/item/{i}": hits.get(f"/item/{i}") for i in range(1, ITEMS + 1)} == {
        f"/item/{i}": 1 for i in range(1, ITEMS + 1)
    }
    stats = {k.decode(): int(v) for k, v in redis_client.hgetall(keys.stats).items()}
    # the second worker's start requests are duplicate starts, not filtered links
    assert (stats["enqueued"], stats["start_duplicates"]) == (ITEMS, ITEMS)
    assert stats.get("filtered", 0) == 0
