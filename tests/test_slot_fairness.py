"""With ``SCHEDULER_PRIORITY_QUEUE = "scrapy.pqueues.DownloaderAwarePriorityQueue"``
(Scrapy's default) requests are handed out from the least busy download slot first, as
Scrapy's queue does: distinct slots come out a, b, c, a, b, c. With ScrapyPriorityQueue, one
global priority order (in-process crawls on a real Redis). Requests handed out from memory
are covered by Scrapy's own test_logic in tests/scrapy_conformance."""

from __future__ import annotations

import json
from typing import Any

import pytest
import scrapy
from scrapy import signals
from scrapy.core.downloader import Downloader
from scrapy.core.engine import ExecutionEngine
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.config.scheduler import DOWNLOADER_AWARE_QUEUE, SchedulerConfig
from tests.spiders import FedSpider

#: Two requests for each of three slots, in the order they are queued.
SLOTS = ["a", "a", "b", "b", "c", "c"]

#: Enough concurrency that the engine takes all six in one go: the order it takes them in is
#: the scheduler's (the downloader's per-slot limit, 8, holds two each).
SETTINGS = {
    "SCHEDULER": "scrapy_ha.Scheduler",
    "CONCURRENT_REQUESTS": 16,
    "HA_IDLE_TIMEOUT": 0.3,
    "DUPEFILTER_CLASS": "scrapy.dupefilters.BaseDupeFilter",
}

FAIR = {"SCHEDULER_PRIORITY_QUEUE": DOWNLOADER_AWARE_QUEUE}
#: Scrapy's other priority queue: one global priority order.
GLOBAL = {"SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.ScrapyPriorityQueue"}


@pytest.fixture(autouse=True)
def fast_engine_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ExecutionEngine, "_SLOT_HEARTBEAT_INTERVAL", 0.2)


def record_slots(crawler: Any) -> list[str]:
    """The download slot of each request, in the order it reaches the downloader."""
    seen: list[str] = []

    def reached(request: scrapy.Request, spider: Any) -> None:
        slot = request.meta.get(Downloader.DOWNLOAD_SLOT)
        if slot in SLOTS:
            seen.append(slot)

    crawler.signals.connect(reached, signal=signals.request_reached_downloader, weak=False)
    return seen


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (FAIR, ["a", "b", "c", "a", "b", "c"]),
        ({}, ["a", "b", "c", "a", "b", "c"]),  # Scrapy's default (2.13+) is the fair one
        (GLOBAL, ["c", "c", "b", "b", "a", "a"]),  # priority, then LIFO (Scrapy's default)
    ],
)
@deferred_f_from_coro_f
async def test_leased_requests_come_out_slot_by_slot(
    redis_url: str, redis_client: Any, site: Any, extra: dict[str, str], expected: list[str]
) -> None:
    entries = [
        json.dumps({"url": f"{site.url}/item/{i}", "meta": {Downloader.DOWNLOAD_SLOT: slot}})
        for i, slot in enumerate(SLOTS)
    ]
    redis_client.rpush("fed:start_urls", *entries)
    settings = {**SETTINGS, "REDIS_URL": redis_url, "HA_FEED": False, **extra}
    crawler = get_crawler(FedSpider, settings)
    seen = record_slots(crawler)
    await crawler.crawl_async()
    assert seen == expected
    assert not crawler.stats.get_value("ha/handed_fresh")  # all came back by lease


@pytest.mark.parametrize(
    ("value", "fair"),
    [
        (DOWNLOADER_AWARE_QUEUE, True),
        ("scrapy.pqueues.ScrapyPriorityQueue", False),
        (None, True),  # Scrapy's default since 2.13
    ],
)
def test_the_priority_queue_setting_picks_the_order(value: str | None, fair: bool) -> None:
    from scrapy.settings import Settings

    settings = Settings({"SCHEDULER_PRIORITY_QUEUE": value} if value else {})
    assert SchedulerConfig.from_settings(settings).slot_fair is fair
