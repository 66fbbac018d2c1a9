"""A revisited page whose visit was retried comes back at its own priority: the lowering of
its retries (``RETRY_PRIORITY_ADJUST``) is for that visit alone. Before, it stayed for every
visit after (one step more per failed attempt), in the payload and in the score its entry
waits with, and such a page went after every other due revisit: in a crawl at its
capacity, visited at 137 s where its interval was 30 s."""

from __future__ import annotations

import asyncio
import json

import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.store.scripts import PRIORITY_STEP
from tests import test_revisit_conditional as conditional
from tests.test_revisit_conditional import (  # noqa: F401 (pytestmark)
    KEYS,
    PagesSpider,
    pytestmark,
    settings,
    stop,
    until,
)
from tests.test_revisit_failures import fail, statuses

changing_site = conditional.changing_site  # the fixture


def priorities(redis_client) -> dict[str, tuple[int, int]]:
    """Each page's (payload priority, priority of the score its entry waits with)."""
    payloads = {i.decode(): json.loads(p) for i, p in redis_client.hgetall(KEYS.payload).items()}
    scores = {i.decode(): v.split()[0] for i, v in redis_client.hgetall(KEYS.delayed_score).items()}
    return {
        p["u"].rsplit("/", 1)[1]: (p.get("p", 0), -(int(scores[i]) // PRIORITY_STEP))
        for i, p in payloads.items()
        if i in scores
    }


@deferred_f_from_coro_f
async def test_a_retried_visit_does_not_lower_the_next_visits_priority(
    redis_url, redis_client, changing_site
):
    base = changing_site("--static")
    extra = {"HA_RETRY_BACKOFF_BASE": 0.1, "HA_RETRY_JITTER": 0, "HA_COMPACT_PAYLOADS": False}
    crawler = get_crawler(PagesSpider, settings(redis_url, **extra))
    crawling = asyncio.ensure_future(crawler.crawl_async(base_url=base))
    await until(lambda: len(statuses(base, 0)) >= 2, "a revisit of page 0", crawling)
    await fail(base, 0, 500)
    await until(lambda: statuses(base, 0).count(500) >= 2, "two retried attempts", crawling)
    await fail(base, 0, 0)  # back: the visit ends, retried
    await until(lambda: statuses(base, 0)[-1] != 500, "the visit after the retries", crawling)
    await until(lambda: "0" in priorities(redis_client), "page 0 waiting again", crawling)
    waiting = priorities(redis_client)
    await stop(crawling, redis_client)
    assert crawler.stats.get_value("ha/retry/server") >= 2
    assert waiting["0"] == (0, 0), waiting  # before: (-2, -2) or lower


class ChildSpider(PagesSpider):
    """Page 0 (priority 10) yields page 1 (priority 0) with its own meta copied, as many
    spiders pass state along (``meta=response.meta``)."""

    async def start(self):
        yield scrapy.Request(f"{self.base_url}/p/0", priority=10, errback=self.on_error)

    def parse(self, response):
        super().parse(response)
        if response.url.endswith("/p/0"):
            yield scrapy.Request(f"{self.base_url}/p/1", meta=dict(response.meta), priority=0)


@deferred_f_from_coro_f
async def test_a_child_made_with_its_retried_page_s_meta_keeps_its_own_priority(
    redis_url, redis_client, changing_site
):
    """Before, the child inherited its page's ``ha_retry_base_priority`` with the copied
    meta, and its first visit's end gave it its page's priority (10), not its own (0)."""
    base = changing_site("--static")
    await fail(base, 0, 500)  # page 0's first attempt fails: it is retried, 10 -> 9
    extra = {"HA_RETRY_BACKOFF_BASE": 0.1, "HA_RETRY_JITTER": 0, "HA_COMPACT_PAYLOADS": False}
    crawler = get_crawler(ChildSpider, settings(redis_url, **extra))
    crawling = asyncio.ensure_future(crawler.crawl_async(base_url=base))
    await until(lambda: statuses(base, 0).count(500) >= 1, "a failed attempt of page 0", crawling)
    await fail(base, 0, 0)
    await until(lambda: "1" in priorities(redis_client), "page 1 waiting again", crawling)
    await until(lambda: "0" in priorities(redis_client), "page 0 waiting again", crawling)
    waiting = priorities(redis_client)
    await stop(crawling, redis_client)
    assert crawler.stats.get_value("ha/retry/server") >= 1
    assert waiting["0"] == (10, 10), waiting
    assert waiting["1"] == (0, 0), waiting  # before: (10, 10), its page's
