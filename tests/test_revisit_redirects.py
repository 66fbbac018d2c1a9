"""A revisited request that is redirected (scheduler/revisits.py ``Revisits.redirected``):
a temporary redirect (302) keeps the revisits with the original, its target fetched at each
of its visits; a permanent one (301) moves them to the target. Before, the target kept the
original's ``ha_revisit`` (RedirectMiddleware copies the meta) and got a revisit entry of
its own: fetched at its own period and again at each of the original's visits, the second
fetch ending as a double."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.keys import Keys
from tests import backqueues
from tests.cli_seed import scrapy_ha
from tests.test_revisits import CONTINUOUS, visits

pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")

INTERVAL = 1.0


class RedirectedSpider(scrapy.Spider):
    """Two revisited start pages: one the site redirects with a 302, one with a 301."""

    name = "redirected"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base_url = base_url

    async def start(self) -> Any:
        for path in ("/redirect/3", "/moved/4"):
            meta = {"ha_revisit": INTERVAL}
            yield scrapy.Request(self.base_url + path, meta=meta, dont_filter=True)

    def parse(self, response: Any) -> Any:
        yield {"id": int(response.css("span.id::text").get())}


@deferred_f_from_coro_f
async def test_a_redirected_revisit_is_fetched_once_a_period(redis_url, site, redis_client):
    settings = {**CONTINUOUS, "REDIS_URL": redis_url}
    crawler = get_crawler(RedirectedSpider, settings)
    crawling = asyncio.ensure_future(crawler.crawl_async(base_url=site.url))
    deadline = time.monotonic() + 60
    while len(visits(site)["/redirect/3"]) < 5 or len(visits(site)["/item/4"]) < 4:
        assert not crawling.done(), "the crawl finished by itself"
        assert time.monotonic() < deadline, visits(site)
        await asyncio.sleep(0.2)
    stopped = await asyncio.to_thread(scrapy_ha, "stop", "redirected", "--redis-url", redis_url)
    assert stopped.returncode == 0, stopped.stderr
    await asyncio.wait_for(crawling, 30)
    times = visits(site)
    # 302: the target at each of the original's visits, and only then (before: its own
    # revisits too, about twice as many fetches)
    assert len(times["/item/3"]) in (len(times["/redirect/3"]), len(times["/redirect/3"]) - 1)
    # 301: the original once, then the target at its interval
    assert len(times["/moved/4"]) == 1
    gaps = [b - a for a, b in zip(times["/item/4"], times["/item/4"][1:], strict=False)]
    assert min(gaps) >= INTERVAL * 0.9, gaps
    keys = Keys("ha", "redirected")
    entries = await asyncio.to_thread(redis_client.zcard, keys.delayed)
    entries += await asyncio.to_thread(backqueues.count, redis_client, keys)
    assert entries == 2  # one revisit entry each: /redirect/3's and /item/4's
    stats = await asyncio.to_thread(redis_client.hgetall, keys.stats)
    assert b"revisit_double" not in stats
