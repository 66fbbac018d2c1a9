"""An item pipeline that fails (a database that is down) loses no item: the page that
yielded the item is crawled again later (failure class ``pipeline``)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from tests.spiders import CatalogueSpider

#: How long the "database" is down after the crawl opens (the issue's scenario).
OUTAGE = 10.0


class DownAtFirstPipeline:
    """Raises for every item during the first OUTAGE seconds, then stores them."""

    stored: list[int] = []
    failed = 0

    def open_spider(self, spider: Any = None) -> None:
        self.up_at = time.monotonic() + OUTAGE

    def process_item(self, item: Any) -> Any:
        if time.monotonic() < self.up_at:
            type(self).failed += 1
            raise ConnectionError("database is down")
        type(self).stored.append(item["id"])
        return item


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


@deferred_f_from_coro_f
async def test_items_failing_in_a_pipeline_for_10s_are_all_stored(redis_url, site):
    DownAtFirstPipeline.stored, DownAtFirstPipeline.failed = [], 0
    settings = {
        "ADDONS": {"scrapy_ha.Addon": 0},
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.5,
        "HA_RETRY_JITTER": 0,
        "LOG_LEVEL": "INFO",
        "ITEM_PIPELINES": {f"{__name__}.DownAtFirstPipeline": 100},
    }
    crawler = get_crawler(CatalogueSpider, settings)
    await crawler.crawl_async(base_url=site.url)
    assert DownAtFirstPipeline.failed > 0
    assert sorted(set(DownAtFirstPipeline.stored)) == list(range(1, 51))
    stats = crawler.stats.get_stats()
    assert stats["ha/retry/pipeline"] >= 50
    assert "ha/dead/pipeline" not in stats
