"""``scrapy-ha pause`` / ``resume`` on a real worker: it stops leasing, finishes what it
holds, stays alive and says so; on resume it goes on and the crawl completes."""

from __future__ import annotations

import json
import re

import pytest

from scrapy_ha.demo import harness
from scrapy_ha.keys import Keys
from tests import backqueues
from tests.cli_seed import delayed, scrapy_ha, sync
from tests.test_crash import count_lines, wait_for_items, worker

PAGES, PER_PAGE = 20, 10


def _heartbeat(redis_client) -> float:
    rows = redis_client.zrange("ha:{catalogue}:workers", 0, 0, withscores=True)
    return rows[0][1] if rows else 0.0


def _renewed_twice(redis_client, proc) -> None:
    """The worker is alive and renews its heartbeat (it is not closing)."""
    for _ in range(2):
        before = _heartbeat(redis_client)
        harness.wait_for(lambda b=before: _heartbeat(redis_client) > b, "a heartbeat", 30)
        assert proc.poll() is None


def test_a_paused_crawl_leases_nothing_and_says_so_in_the_sync(redis_url):
    """The short version: what every worker's sync sees."""
    delayed(redis_url, "catalogue", [("http://a.example/1", 0, "server")])
    assert scrapy_ha("pause", "catalogue", "--redis-url", redis_url).returncode == 0
    held = sync(redis_url, "catalogue", lease=10)
    assert held.paused and held.leases == [] and held.delayed == 1  # not even promoted
    assert scrapy_ha("resume", "catalogue", "--redis-url", redis_url).returncode == 0
    going = sync(redis_url, "catalogue", lease=10)
    assert not going.paused and len(going.leases) == 1


@pytest.mark.long  # a real worker, about a minute: `make test-long`
def test_pause_holds_a_live_crawl_and_resume_finishes_it(
    redis_url, redis_client, site_factory, tmp_path
):
    site = site_factory("--pages", str(PAGES), "--per-page", str(PER_PAGE), "--delay", "0.2")
    items, log = tmp_path / "items.jl", tmp_path / "worker.log"
    live = worker(redis_url, site.url, items, log)
    try:
        wait_for_items(items, 20, live)
        paused = scrapy_ha("pause", "catalogue", "--redis-url", redis_url)
        assert paused.returncode == 0 and "catalogue paused since" in paused.stdout
        harness.wait_for(lambda: "crawl paused by operator" in log.read_text(), "the log", 60)
        harness.wait_for(
            lambda: redis_client.zcard("ha:{catalogue}:leased") == 0, "its leases done", 60
        )
        held = count_lines(items)
        _renewed_twice(redis_client, live)
        assert count_lines(items) == held  # nothing new leased meanwhile
        assert backqueues.count(redis_client, Keys("ha", "catalogue")) > 0
        shown = scrapy_ha("workers", "catalogue", "--redis-url", redis_url).stdout
        assert "the crawl is paused since" in shown
        status = scrapy_ha("status", "catalogue", "--redis-url", redis_url).stdout
        eta = next(line for line in status.splitlines() if line.strip().startswith("eta"))
        assert re.fullmatch(r" *eta  none while paused: [\d,]+ left", eta), eta  # no countdown
        doc = json.loads(
            scrapy_ha("status", "catalogue", "--json", "--redis-url", redis_url).stdout
        )
        assert doc["paused"] and doc["eta_seconds"] is None
        again = scrapy_ha("pause", "catalogue", "--redis-url", redis_url).stdout
        assert "already paused" in again
        assert log.read_text().count("crawl paused by operator") == 1
        resumed = scrapy_ha("resume", "catalogue", "--redis-url", redis_url)
        assert resumed.stdout.strip() == "catalogue resumed: workers lease again"
        assert live.wait(120) == 0
    finally:
        if live.poll() is None:
            live.kill()
    assert "crawl resumed by operator" in log.read_text()
    assert count_lines(items) == PAGES * PER_PAGE
    not_paused = scrapy_ha("resume", "catalogue", "--redis-url", redis_url)
    assert not_paused.stdout.strip() == "catalogue was not paused"


@pytest.mark.parametrize("command", ["pause", "resume"])
def test_pause_and_resume_need_a_spider(command):
    assert scrapy_ha(command).returncode == 2
