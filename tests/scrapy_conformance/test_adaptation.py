"""scrapy-ha's own check of this folder: the tests above really run scrapy-ha.

If the fixture stopped applying, every copied test would pass with Scrapy's own scheduler
and prove nothing; these tests fail then.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest
from scrapy.utils.test import get_crawler

from tests.scrapy_conformance.scheduler_under_test import BASELINE_ENV, Scheduler
from tests.scrapy_conformance.test_signals import ItemSpider
from tests.scrapy_conformance.utils.decorators import coroutine_test

if TYPE_CHECKING:
    from tests.scrapy_conformance.mockserver.http import MockServer

pytestmark = pytest.mark.skipif(
    os.environ.get(BASELINE_ENV) == "1", reason="baseline run: Scrapy's own scheduler"
)


def test_every_crawler_defaults_to_scrapy_ha(scrapy_ha_scheduler: str) -> None:
    settings = get_crawler().settings
    assert settings["SCHEDULER"] == "scrapy_ha.Scheduler"
    assert settings["REDIS_URL"] == scrapy_ha_scheduler
    assert Scheduler.__module__ == "scrapy_ha.scheduler.shell"


@coroutine_test
async def test_a_crawl_goes_through_redis(mockserver: MockServer) -> None:
    crawler = get_crawler(ItemSpider)
    await crawler.crawl_async(mockserver=mockserver)
    assert crawler.stats.get_value("ha/enqueued") == 10
    assert crawler.stats.get_value("ha/acked") == 10
    assert crawler.stats.get_value("item_scraped_count") == 10
