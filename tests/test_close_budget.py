"""A close whose budget (``HA_CLOSE_TIMEOUT``) runs out before Redis is done with it."""

from __future__ import annotations

import logging

from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from tests.spiders import CatalogueSpider
from tests.test_scheduler_semantics import settings


@deferred_f_from_coro_f
async def test_a_close_out_of_time_holding_nothing_says_so(redis_url, site_factory, caplog):
    """A QA run: ``HA_CLOSE_TIMEOUT=1e-9`` logged "Could not hand back 0 lease(s)", an
    ERROR of leases to reclaim where none was held."""
    site = site_factory("--pages", "1", "--per-page", "3")
    crawler = get_crawler(CatalogueSpider, settings(redis_url, HA_CLOSE_TIMEOUT=1e-9))
    with caplog.at_level(logging.INFO):
        await crawler.crawl_async(base_url=site.url)
    assert len(crawler.spider.items) == 3
    assert "hand back 0 lease" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "this worker held no lease, so nothing waits to be reclaimed" in caplog.text
