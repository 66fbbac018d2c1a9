"""A run seeds a checkpointed task once: a worker that restarts into a run whose queue is
intact (its predecessor killed) leaves the task's chain to the queue instead of queueing
the checkpointed page a second time; a task that branches is never marked done by its
first branch (real redis-server, real crawls, SIGKILL)."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from typing import TYPE_CHECKING

import pytest

from scrapy_ha.keys import Keys
from tests.test_checkpoint_garbage import ids_in
from tests.test_checkpoints import run_paged, wait_for_checkpoint

if TYPE_CHECKING:
    from pathlib import Path

#: short leases, and a killed worker's heartbeat that does not outlive them (the worker
#: that finishes the crawl waits for every live heartbeat: 30 s by default)
FAST = {
    "HA_LEASE_TIME": "4",
    "HA_LEASE_RENEW_INTERVAL": "1",
    "HA_RECLAIM_INTERVAL": "1",
    "HA_HEARTBEAT_TTL": "4",
}


@pytest.mark.parametrize("plain", ["", "1"], ids=["dont_filter-root", "plain-root"])
def test_a_worker_restarted_on_an_intact_queue_does_not_queue_the_checkpointed_page_again(
    redis_url, redis_client, site_factory, tmp_path: Path, plain: str
):
    """With a root filtered as any request (``plain``) too: its resumed page was queued
    again (a run's start deduplication only knew ``dont_filter`` roots; a QA run)."""
    site = site_factory("--pages", "10", "--per-page", "5", "--slow-list", "5:20")
    items = tmp_path / "items.jl"
    settings = {**FAST, "plain": plain}
    first = run_paged(redis_url, site.url, items, tmp_path / "first.log", **settings)
    deadline = time.monotonic() + 60
    while not any(path == "/list/5" for _, path, _ in site.log()):
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    wait_for_checkpoint(redis_client, first, 60, page=5, items=20)
    # and page 4 acked: its checkpoint goes ahead of its ack, and a kill between the two
    # had page 4 redone and its items written twice (under a load average of 6)
    acked = Keys("ha", "paged").stats
    while int(redis_client.hget(acked, "acked") or 0) < 4:
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)  # page 5 stays leased in Redis until its lease expires
    first.wait()
    before = len(site.log())
    second = run_paged(redis_url, site.url, items, tmp_path / "second.log", **settings)
    assert second.wait(timeout=120) == 0
    fetched = Counter(path for _, path, _ in site.log()[before:])
    assert fetched["/list/5"] == 1, fetched  # reclaimed from the queue, not queued again
    assert ids_in(items) == list(range(1, 51))  # none twice
    assert json.loads(redis_client.get(redis_client.keys("ha:{paged}:cp:*")[0]))["done"]
    log = (tmp_path / "second.log").read_text()
    assert "'ha/start_filtered': 1" in log
    # the page resumed from the checkpoint was filtered: no task resumed (a QA run)
    assert "Resum" not in log and "ha/checkpoint/resumed" not in log


def test_a_branching_task_is_never_marked_done_by_its_first_branch(
    redis_url, redis_client, site_factory, tmp_path: Path
):
    """``/`` yields three chains of three pages for its own callback; the first and third
    end while the second waits on its slow page 5. Killed then, the queue lost: the task
    must not be skipped as finished (items 21-30 were never crawled again)."""
    site = site_factory("--pages", "9", "--per-page", "5", "--chains", "3", "--slow-list", "5:8")
    items = tmp_path / "items.jl"
    first = run_paged(redis_url, site.url, items, tmp_path / "first.log", "tree_spider.py")
    deadline = time.monotonic() + 60
    while not {"/list/3", "/list/9"} <= set(site.hits()):
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(1.5)  # their acks (and what they saved) reach Redis
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert "/list/6" not in site.hits()
    redis_client.delete(*Keys("ha", "paged").all())  # the queue is lost
    second = run_paged(redis_url, site.url, items, tmp_path / "second.log", "tree_spider.py")
    assert second.wait(timeout=120) == 0
    assert "is done (its checkpoint says so)" not in (tmp_path / "second.log").read_text()
    assert set(ids_in(items)) == set(range(1, 46))
    assert "branches (a page yielded 3 next pages)" in (tmp_path / "first.log").read_text()
