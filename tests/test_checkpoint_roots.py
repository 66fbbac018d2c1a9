"""A page that yields named task roots (the example project's home page), redone after its
worker was killed, resumes each task from its checkpoint: the resumed page is filtered as
the root is, whose chain the first attempt queued (before, every task's checkpointed page
was crawled once more, and its items went to the sink twice, with the outbox too; a QA
run). Real redis-server, real crawls, SIGKILL."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from typing import TYPE_CHECKING

from tests.test_checkpoint_garbage import ids_in
from tests.test_checkpoint_seeding import FAST
from tests.test_checkpoints import run_paged

if TYPE_CHECKING:
    from pathlib import Path

#: The second page of each task, whose first fetch hangs: the killed worker held it.
HELD = ("/list/2", "/list/5", "/list/8")


def test_a_redone_page_resumes_its_named_tasks_without_crawling_them_again(
    redis_url, redis_client, site_factory, tmp_path: Path
):
    slow = [a for n in (2, 5, 8) for a in ("--slow-list", f"{n}:60")]
    site = site_factory("--pages", "9", "--per-page", "5", *slow)
    items = tmp_path / "items.jl"
    first = run_paged(
        redis_url, site.url, items, tmp_path / "first.log", "roots_spider.py", hold="1", **FAST
    )

    def at_second_pages() -> bool:  # each task's page 2 (its first hit hangs)
        saved = [redis_client.get(f"ha:{{paged}}:cp:{task}") for task in "abc"]
        return all(doc and json.loads(doc)["page"] == 2 for doc in saved)

    deadline = time.monotonic() + 60
    while not (at_second_pages() and set(HELD) <= set(site.hits())):
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)  # the home page and the second pages stay leased
    first.wait()
    before = len(site.log())
    second = run_paged(
        redis_url, site.url, items, tmp_path / "second.log", "roots_spider.py", **FAST
    )
    assert second.wait(timeout=120) == 0
    fetched = Counter(path for _, path, _ in site.log()[before:])
    assert fetched["/"] == 1  # the home page redone
    assert {path: fetched[path] for path in HELD} == dict.fromkeys(HELD, 1), fetched
    assert sorted(ids_in(items)) == list(range(1, 46))  # none lost, none twice
