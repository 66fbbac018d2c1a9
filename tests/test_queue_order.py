"""Order within a priority follows Scrapy's settings (LIFO by default), and priorities
beyond the stored range are clamped loudly (in-process crawls, real Redis)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

#: One request at a time, so the order of downloads is the order of the queue.
SERIAL = {
    "SCHEDULER": "scrapy_ha.Scheduler",
    "CONCURRENT_REQUESTS": 1,
    "HA_IDLE_TIMEOUT": 0.3,
    "LOG_LEVEL": "INFO",
}


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


class ChildrenSpider(scrapy.Spider):
    """One page yields five children of one priority (and one far above the range)."""

    name = "order"

    def __init__(self, base_url: str = "", extra_priority: int = 0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/list/1"]
        self.base_url = base_url
        self.extra_priority = extra_priority
        self.seen: list[int] = []

    def parse(self, response: Any) -> Any:
        for i in range(1, 6):
            yield scrapy.Request(f"{self.base_url}/item/{i}", callback=self.parse_item)
        if self.extra_priority:
            yield scrapy.Request(
                f"{self.base_url}/item/9", callback=self.parse_item, priority=self.extra_priority
            )

    def parse_item(self, response: Any) -> None:
        self.seen.append(int(response.url.rsplit("/", 1)[1]))


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({}, [5, 4, 3, 2, 1]),  # Scrapy's default queues are LIFO
        (
            {
                "SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue",
                "SCHEDULER_DISK_QUEUE": "scrapy.squeues.PickleFifoDiskQueue",
            },
            [1, 2, 3, 4, 5],
        ),
        ({"HA_QUEUE_ORDER": "fifo"}, [1, 2, 3, 4, 5]),
        (
            {"SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue", "HA_QUEUE_ORDER": "lifo"},
            [5, 4, 3, 2, 1],
        ),
    ],
)
@deferred_f_from_coro_f
async def test_order_within_a_priority_follows_scrapys_settings(redis_url, site, extra, expected):
    crawler = get_crawler(ChildrenSpider, {**SERIAL, "REDIS_URL": redis_url, **extra})
    await crawler.crawl_async(base_url=site.url)
    assert crawler.spider.seen == expected


@deferred_f_from_coro_f
async def test_a_priority_beyond_the_range_is_clamped_with_a_warning(redis_url, site, caplog):
    caplog.set_level(logging.WARNING, logger="scrapy_ha")
    crawler = get_crawler(ChildrenSpider, {**SERIAL, "REDIS_URL": redis_url})
    await crawler.crawl_async(base_url=site.url, extra_priority=100_000)
    assert crawler.spider.seen[0] == 9  # still first: clamped to the top of the range
    assert crawler.stats.get_value("ha/priority_clamped") == 1
    (warning,) = [r for r in caplog.records if "outside the range" in r.getMessage()]
    assert "/item/9" in warning.getMessage() and "4095" in warning.getMessage()


def test_a_bad_queue_order_names_the_setting():
    from scrapy.settings import Settings

    from scrapy_ha.config.scheduler import SchedulerConfig
    from scrapy_ha.config.validate import ConfigError

    with pytest.raises(ConfigError, match="HA_QUEUE_ORDER='depth'"):
        SchedulerConfig.from_settings(Settings({"HA_QUEUE_ORDER": "depth"}))
    config = SchedulerConfig.from_settings(Settings({"HA_LEASE_TIME": 40}))
    assert (config.order, config.renew_watchdog) == ("lifo", 400)
