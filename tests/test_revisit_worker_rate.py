"""A worker's pages per second count its revisits: each visit done is a page done, as the
crawl's ``acked`` counts it. Before, a revisit's end was not counted in the rate a worker
measures between renewals (only the acks of its sync rounds were): in a QA run of 800
pages revisited every 30 s by 3 workers, about 9 pages/s each, ``scrapy-ha workers`` said
``PAGES/S 0`` for every worker, and the prefetch, which that rate caps, followed the few
new pages acked instead of the visits."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from tests.cli_seed import scrapy_ha
from tests.spiders import CatalogueSpider

pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")

SETTINGS = {
    "ADDONS": {"scrapy_ha.Addon": 0},
    "HA_IDLE_TIMEOUT": 0.3,
    # renewals 2 s apart: each window holds two rounds of the 1 s revisits (0.5 s apart,
    # one window in two held no visit's end: 0.0, 99.35, 0.0 published, 1 run in 3 failed)
    "HA_LEASE_TIME": 6,
    "HA_LEASE_RENEW_INTERVAL": 2,
    "HA_HEARTBEAT_TTL": 6,
    "LOG_LEVEL": "INFO",
    "HA_REVISIT": {r"/item/": 1.0},
}


def _published(redis_client) -> list[tuple[int, float | None]]:
    """(renewal time, rate) each live worker published last."""
    rows = []
    for raw in redis_client.hgetall("ha:{catalogue}:wstats").values():
        at, _, doc = raw.partition(b" ")
        rows.append((int(at), json.loads(doc).get("rate")))
    return rows


@deferred_f_from_coro_f
async def test_a_worker_that_only_revisits_publishes_the_pages_it_visits(
    redis_url, site, redis_client
):
    crawler = get_crawler(CatalogueSpider, {**SETTINGS, "REDIS_URL": redis_url})
    crawling = asyncio.ensure_future(crawler.crawl_async(base_url=site.url))
    deadline = time.monotonic() + 60
    try:
        # every page of the site crawled, and its 50 item pages visited 4 times more: from
        # here on the worker only revisits (its list pages were acked long ago)
        while (crawler.stats.get_value("ha/revisit/scheduled") or 0) < 250:
            assert not crawling.done(), "the crawl finished by itself"
            assert time.monotonic() < deadline, crawler.stats.get_stats()
            await asyncio.sleep(0.2)
        acked = crawler.stats.get_value("ha/acked")
        rates: dict[int, float | None] = {}
        while len(rates) < 3:  # three renewals published after that
            assert time.monotonic() < deadline, rates
            for at, rate in await asyncio.to_thread(_published, redis_client):
                rates.setdefault(at, rate)
            await asyncio.sleep(0.2)
        assert crawler.stats.get_value("ha/acked") == acked  # no ack meanwhile: visits alone
        later = sorted(rates.items())[1:]  # (the first may have been measured before)
        assert all(rate and rate > 5 for _, rate in later), rates  # ~50 visits a second
        out = await asyncio.to_thread(
            scrapy_ha, "workers", "catalogue", "--json", "--redis-url", redis_url
        )
        (row,) = json.loads(out.stdout)
        assert row["pages_per_s"] and row["pages_per_s"] > 5, row
    finally:
        await asyncio.to_thread(scrapy_ha, "stop", "catalogue", "--redis-url", redis_url)
        await asyncio.wait_for(crawling, 30)
