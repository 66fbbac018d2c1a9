"""Checkpoint bookkeeping within a page: linear in its items, and a failed item holds the
mid-page checkpoint back."""

from __future__ import annotations

import itertools
import random
import time

from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from scrapy_ha import metakeys
from scrapy_ha.checkpoint import CheckpointMiddleware, _Progress

#: Items of one feed page (the issue's size), and the time they may add.
FEED_PAGE_ITEMS = 100_000
BUDGET_SECONDS = 1.0


def middleware(saves: list[int]) -> CheckpointMiddleware:
    crawler = get_crawler(Spider, {"HA_CHECKPOINTS": True, "HA_CHECKPOINT_ITEMS": 50})
    mw = CheckpointMiddleware(crawler)
    mw._save_mid_page = lambda progress: saves.append(progress.prefix)  # type: ignore[method-assign]
    return mw


def completion_order(n: int, window: int = 100) -> list[int]:
    """Items finish out of order within CONCURRENT_ITEMS (100) of each other."""
    order = list(range(1, n + 1))
    rng = random.Random(7)
    for start in range(0, n, window):
        chunk = order[start : start + window]
        rng.shuffle(chunk)
        order[start : start + window] = chunk
    return order


def test_a_page_of_100000_items_adds_under_a_second():
    saves: list[int] = []
    mw = middleware(saves)
    page = Request("http://example.com/feed", meta={metakeys.LEASE: ("1", "1:1"), "ha_task": "t"})
    items = [{"id": i} for i in range(1, FEED_PAGE_ITEMS + 1)]
    started = time.process_time()  # CPU time: the machine may be busy with other work
    progress = _Progress(page)
    for index, item in enumerate(items, 1):
        mw._track(item, progress, index)
    for index in completion_order(FEED_PAGE_ITEMS):
        mw._item_done(items[index - 1])
        if index % 1000 == 0:
            assert time.process_time() - started < BUDGET_SECONDS, f"{index} items: too slow"
    assert time.process_time() - started < BUDGET_SECONDS
    assert progress.prefix == FEED_PAGE_ITEMS and not progress.ahead and saves == sorted(saves)
    assert all(b - a >= 50 for a, b in itertools.pairwise([0, *saves]))
    assert not mw._pending


def test_a_failed_item_holds_the_mid_page_checkpoint_back():
    saves: list[int] = []
    mw = middleware(saves)
    page = Request("http://example.com/list", meta={metakeys.LEASE: ("1", "1:1"), "ha_task": "t"})
    items = [{"id": i} for i in range(1, 201)]
    progress = _Progress(page)
    for index, item in enumerate(items, 1):
        mw._track(item, progress, index)
    for item in items:
        if item["id"] == 70:
            mw._item_failed(item)  # item_error: the database refused it
        else:
            mw._item_done(item)
    assert saves == [50]  # never past item 69


def test_a_page_resumed_past_its_first_items_goes_on_saving():
    """A page run again with 100 items skipped checkpoints 150, 200 (absolute), and the
    task's item count goes on from where it was."""
    saved: list[tuple[int, int]] = []
    mw = middleware([])
    mw._save_mid_page = lambda p: saved.append((p.prefix, p.items_before + p.prefix))  # type: ignore[method-assign]
    page = Request("http://example.com/list/3", meta={metakeys.LEASE: ("1", "1:1"), "ha_task": "t"})
    progress = _Progress(page, {"page": 3, "items": 300}, skip=100)  # 200 before page 3
    items = [{"id": i} for i in range(101, 201)]
    for index, item in enumerate(items, 101):
        mw._track(item, progress, index)
    for item in items:
        mw._item_done(item)
    assert saved == [(150, 350), (200, 400)]
