"""Garbage in one task's checkpoint costs that task's progress alone: the task starts from
its root, every other task and every other page goes on (real redis-server, real crawls)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.store.wire import Commit, NewEntry
from tests.test_checkpoints import checkpoint, run_paged
from tests.test_queue_scripts import open_queue

if TYPE_CHECKING:
    from pathlib import Path


def ids_in(items: Path) -> list[int]:
    return sorted(json.loads(line)["id"] for line in items.read_text().splitlines())


def test_a_checkpoint_of_another_shape_starts_its_task_from_the_root(
    redis_url, redis_client, site_factory, tmp_path: Path
):
    """Task a's "next" is a number, task b's page is text, task c's page is text and it
    has no "next" (written by hand: before, c started from its root without a word): each
    starts from its root request, said once. None stops the spider's start()."""
    site = site_factory("--pages", "9", "--per-page", "5")
    redis_client.set("ha:{paged}:cp:a", json.dumps({"task": "a", "page": 2, "next": 5}))
    good_next = json.dumps({"u": site.url + "/list/5"})
    redis_client.set("ha:{paged}:cp:b", json.dumps({"task": "b", "page": "x", "next": good_next}))
    redis_client.set("ha:{paged}:cp:c", json.dumps({"task": "c", "page": "x"}))
    items, log = tmp_path / "items.jl", tmp_path / "run.log"
    worker = run_paged(redis_url, site.url, items, log, spider_file="tasks_spider.py")
    assert worker.wait(timeout=120) == 0
    text = log.read_text()
    assert "Error while reading start" not in text
    assert text.count("is unreadable") == 3
    assert "'ha/checkpoint/unreadable': 3" in text
    assert ids_in(items) == list(range(1, 46))  # every task, every page, from its root


@pytest.mark.parametrize("items_mode", ["off", "outbox"])
def test_fields_a_checkpoint_cannot_store_are_dropped_and_the_task_goes_on(
    redis_url, redis_client, site_factory, tmp_path: Path, items_mode
):
    """Page 2 puts a lone surrogate, a set and a 1000-deep list in its checkpoint fields:
    each is dropped with a warning (never carried to page 3), the crawl ends with every
    item and the task's checkpoint done (the lone surrogate was refused by Redis: the worker
    stopped, or the page's ack was refused as stale until it was dead-lettered)."""
    site = site_factory("--pages", "4", "--per-page", "5")
    items, log = tmp_path / "items.jl", tmp_path / "run.log"
    extra = {"BAD_FIELDS_AT": "/list/2", "HA_CHECKPOINT_ITEMS": "2", "HA_ITEMS": items_mode}
    worker = run_paged(redis_url, site.url, items, log, **extra)
    assert worker.wait(timeout=120) == 0
    if items_mode == "off":
        assert ids_in(items) == list(range(1, 21))
    else:
        assert redis_client.xlen("ha:{paged}:items") == 20
    saved = checkpoint(redis_client)
    assert saved["done"] and saved["fields"] == {"pages_seen": 4}
    text = log.read_text()
    assert "refused" not in text and "Traceback" not in text
    assert "'ha/checkpoint/fields_dropped': 3" in text


def test_a_checkpoint_redis_refuses_is_dropped_and_the_worker_goes_on(
    redis_url, redis_client, site_factory, tmp_path: Path
):
    """A save Redis refuses as it is (not a checkpoint cjson reads) would be refused at
    every try: it is dropped with an ERROR, and the crawl goes on (it stopped every round
    of the worker: nothing more was acked or leased)."""
    site = site_factory("--pages", "4", "--per-page", "5")
    items, log = tmp_path / "items.jl", tmp_path / "run.log"
    worker = run_paged(redis_url, site.url, items, log, RAW_BAD_CHECKPOINT_AT="/list/2")
    assert worker.wait(timeout=120) == 0
    assert ids_in(items) == list(range(1, 21))
    assert checkpoint(redis_client)["done"]  # the task's own checkpoints are saved
    text = log.read_text()
    assert "Checkpoint of task raw refused by Redis" in text
    assert "'ha/checkpoint/failed': 1" in text


@deferred_f_from_coro_f
async def test_an_ack_with_a_checkpoint_redis_cannot_read_commits_without_it(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([NewEntry(b"", 0, b"page")])
    (lease,) = await q.lease(1, 30000)
    pair = (lease.id, lease.token)
    bad = b'{"task":"T","of":1,"page":2,"title":"caf\\ud83d"}'  # a lone surrogate
    commits = {pair: Commit(items=(b"item-1",), checkpoint=("T", bad, 60_000))}
    result = await q.sync(ack=[pair], commits=commits)
    assert (result.acked, result.stale, result.items, result.checkpoints) == (1, 0, 1, 0)
    assert await q.client.xlen(q.keys.items) == 1
    assert not await q.client.exists(q.keys.checkpoint("T"))
    assert await q.client.hget(q.keys.stats, "checkpoints_dropped") == b"1"
    await q.client.aclose()


def _nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_a_field_nested_past_what_python_encodes_is_dropped_not_carried():
    """Review of the first version: a field nested ~997 deep passed its check (the walk's
    limit was cjson's 1,000) but failed Python's encoder, so every later checkpoint of its
    task was skipped while the field was carried on."""
    from scrapy.statscollectors import MemoryStatsCollector  # noqa: PLC0415
    from scrapy.utils.test import get_crawler  # noqa: PLC0415

    from scrapy_ha.middlewares.storable import checkpoint_payload  # noqa: PLC0415

    stats = MemoryStatsCollector(get_crawler())
    fields = {"deep": _nested(sys.getrecursionlimit() - 20), "page_note": "ok"}
    doc = {"page": 3, "items": 10, "fields": fields}
    payload = checkpoint_payload("t", doc, max_bytes=1 << 20, stats=stats)
    assert payload is not None and json.loads(payload)["fields"] == {"page_note": "ok"}
    assert fields == {"page_note": "ok"}  # not carried to the next pages
    assert stats.get_value("ha/checkpoint/fields_dropped") == 1


def test_a_checkpoint_is_encoded_once_without_a_walk_in_python(monkeypatch):
    """Review: the strict check walked every checkpoint in Python twice a page, 35 times
    the cost of its encoding (6 MB: 4.2 s against 0.16 s), on the reactor."""
    from scrapy.statscollectors import MemoryStatsCollector  # noqa: PLC0415
    from scrapy.utils.test import get_crawler  # noqa: PLC0415

    from scrapy_ha.middlewares import storable  # noqa: PLC0415

    def walked(*args: object, **kwargs: object) -> None:
        raise AssertionError("a checkpoint that encodes was walked in Python")

    monkeypatch.setattr(storable, "storable_problem", walked)
    stats = MemoryStatsCollector(get_crawler())
    fields = {"rows": [{"id": n, "name": f"ré{n}"} for n in range(1000)]}
    storable.drop_unstorable("t", fields, stats)
    doc = {"page": 2, "items": 5, "fields": fields}
    payload = storable.checkpoint_payload("t", doc, max_bytes=1 << 20, stats=stats)
    assert payload is not None and json.loads(payload)["fields"] == fields
