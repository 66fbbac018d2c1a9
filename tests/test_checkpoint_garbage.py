"""Garbage in one task's checkpoint costs that task's progress alone: the task starts from
its root, every other task and every other page goes on (real redis-server, real crawls)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from tests.test_checkpoints import run_paged

if TYPE_CHECKING:
    from pathlib import Path


def ids_in(items: Path) -> list[int]:
    return sorted(json.loads(line)["id"] for line in items.read_text().splitlines())


def test_a_checkpoint_of_another_shape_starts_its_task_from_the_root(
    redis_url, redis_client, site_factory, tmp_path: Path
):
    """Task a's "next" is a number, task b's page is text: each starts from its root
    request; task c (no checkpoint) runs as ever. None stops the spider's start()."""
    site = site_factory("--pages", "9", "--per-page", "5")
    redis_client.set("ha:{paged}:cp:a", json.dumps({"task": "a", "page": 2, "next": 5}))
    good_next = json.dumps({"u": site.url + "/list/5"})
    redis_client.set("ha:{paged}:cp:b", json.dumps({"task": "b", "page": "x", "next": good_next}))
    items, log = tmp_path / "items.jl", tmp_path / "run.log"
    worker = run_paged(redis_url, site.url, items, log, spider_file="tasks_spider.py")
    assert worker.wait(timeout=120) == 0
    text = log.read_text()
    assert "Error while reading start" not in text
    assert text.count("is unreadable") == 2
    assert "'ha/checkpoint/unreadable': 2" in text
    assert ids_in(items) == list(range(1, 46))  # every task, every page, from its root
