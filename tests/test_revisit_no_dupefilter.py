"""Revisits in a crawl that does not deduplicate (``DUPEFILTER_CLASS = BaseDupeFilter``):
one URL still has one revisit entry (lua/lib/revisit.lua's rule, by the URL's fingerprint),
so a URL linked from two pages is not revisited twice as often."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.keys import Keys
from tests import backqueues
from tests.cli_seed import scrapy_ha
from tests.spiders import CatalogueSpider
from tests.test_revisits import CONTINUOUS, pytestmark, visits  # noqa: F401 (pytestmark)

INTERVAL = 1.0


class TwiceLinkedSpider(CatalogueSpider):
    """/list/1 asked for at start, and linked from / (nothing filters the link)."""

    name = "twicelinked"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self.start_urls = [base_url + "/", base_url + "/list/1"]


@deferred_f_from_coro_f
async def test_without_a_dupefilter_one_url_has_one_revisit_entry(
    redis_url, site_factory, redis_client
):
    """Before, a crawl without a dupefilter sent no fingerprint with a revisit, so the
    one-revisit-per-URL rule did not hold: each copy of /list/1 became a revisit entry of
    its own, and the page was fetched twice per interval (44 fetches against 9 in 10 s
    for a page linked from several)."""
    site = site_factory("--pages", "2", "--per-page", "1")
    settings = {
        **CONTINUOUS,
        "REDIS_URL": redis_url,
        "HA_REVISIT": {r"/list/1$": INTERVAL},
        "DUPEFILTER_CLASS": "scrapy.dupefilters.BaseDupeFilter",
    }
    crawler = get_crawler(TwiceLinkedSpider, settings)
    crawling = asyncio.ensure_future(crawler.crawl_async(base_url=site.url))
    deadline = time.monotonic() + 90
    while len(visits(site)["/list/1"]) < 6:
        assert not crawling.done(), "the crawl finished by itself"
        assert time.monotonic() < deadline, visits(site)
        await asyncio.sleep(0.2)
    stopped = await asyncio.to_thread(scrapy_ha, "stop", "twicelinked", "--redis-url", redis_url)
    assert stopped.returncode == 0, stopped.stderr
    await asyncio.wait_for(crawling, 30)
    keys = Keys("ha", "twicelinked")
    queued = await asyncio.to_thread(redis_client.zcard, keys.delayed)
    queued += await asyncio.to_thread(backqueues.count, redis_client, keys)
    assert queued == 1, visits(site)  # /list/1's one entry (before: one per copy)
    assert await asyncio.to_thread(redis_client.zcard, keys.revisits) == 1
    stats = await asyncio.to_thread(redis_client.hgetall, keys.stats)
    assert stats.get(b"revisit_double") == b"1"  # the second copy to finish its first visit
    starts = visits(site)["/list/1"][2:]  # once both copies had their first visit
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert min(gaps) >= INTERVAL * 0.9, gaps  # never sooner than its interval: no double
    assert not await asyncio.to_thread(redis_client.exists, keys.dupefilter)  # none kept
