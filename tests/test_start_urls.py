"""Start URLs from Redis in scrapy-redis's convention, on Scrapy 2.16+."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from scrapy import signals
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from tests.spiders import FedSpider

#: Seconds an idle crawl with live peers waits before it closes (short: a test).
IDLE_TIMEOUT = 0.3
#: Idle signals the feed-mode test waits for: each one is a chance to close the spider.
IDLE_ROUNDS = 5


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


def settings(redis_url, **extra):
    return {
        "SCHEDULER": "scrapy_ha.Scheduler",
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": IDLE_TIMEOUT,
        **extra,
    }


@deferred_f_from_coro_f
async def test_plain_and_json_entries_are_crawled_and_bad_ones_dropped(
    redis_url, redis_client, site
):
    redis_client.rpush(
        "fed:start_urls",
        f"{site.url}/item/1",
        json.dumps({"url": f"{site.url}/item/2", "meta": {"tag": "json"}}),
        "{not json",
        f"{site.url}/item/1",  # pushed twice: crawled twice, as in scrapy-redis
    )
    crawler = get_crawler(FedSpider, settings(redis_url, HA_FEED=False))
    await crawler.crawl_async()
    assert sorted(crawler.spider.seen) == [
        f"GET {site.url}/item/1 None",
        f"GET {site.url}/item/1 None",
        f"GET {site.url}/item/2 json",
    ]
    assert crawler.stats.get_value("ha/start_urls") == 3
    assert crawler.stats.get_value("ha/start_urls_invalid") == 1
    assert redis_client.llen("fed:start_urls") == 0


@deferred_f_from_coro_f
async def test_feed_mode_waits_for_more_start_urls(redis_url, redis_client, site):
    crawler = get_crawler(FedSpider, settings(redis_url))
    idle_at: list[float] = []

    def idle() -> None:  # held here: signal handlers are weak references
        idle_at.append(time.monotonic())

    crawler.signals.connect(idle, signal=signals.spider_idle)
    crawling = asyncio.ensure_future(crawler.crawl_async())
    # a spider that may close closes at its first idle signal (HA_IDLE_TIMEOUT later with
    # peers): idle signals well past HA_IDLE_TIMEOUT prove a feed-mode spider stays open
    deadline = time.monotonic() + 30
    while len(idle_at) < IDLE_ROUNDS or idle_at[-1] - idle_at[0] <= 2 * IDLE_TIMEOUT:
        assert not crawling.done(), "the feed-mode spider closed while idle"
        assert time.monotonic() < deadline, f"{len(idle_at)} idle signals in 30 s"
        await asyncio.sleep(0.05)
    assert not crawling.done()
    redis_client.lpush("fed:start_urls", f"{site.url}/item/5")
    deadline = time.monotonic() + 30
    while not crawler.spider.seen:
        assert time.monotonic() < deadline, "the start URL pushed was not crawled in 30 s"
        await asyncio.sleep(0.05)
    await crawler.stop_async()
    await crawling
    assert crawler.spider.seen == [f"GET {site.url}/item/5 None"]


@deferred_f_from_coro_f
async def test_start_urls_as_a_set(redis_url, redis_client, site):
    redis_client.sadd("fed:start_urls", f"{site.url}/item/3", f"{site.url}/item/4")
    crawler = get_crawler(
        FedSpider, settings(redis_url, HA_FEED=False, REDIS_START_URLS_AS_SET=True)
    )
    await crawler.crawl_async()
    assert sorted(crawler.spider.seen) == [
        f"GET {site.url}/item/3 None",
        f"GET {site.url}/item/4 None",
    ]
    assert redis_client.scard("fed:start_urls") == 0


@deferred_f_from_coro_f
async def test_json_entries_other_keys_are_form_fields_as_in_scrapy_redis(
    redis_url, redis_client, site
):
    """scrapy-redis makes a FormRequest of a JSON entry, its keys other than url, method and
    meta its formdata; they were dropped (a QA run: a moved project's entry with a "data"
    key fetched the bare URL, where scrapy-redis fetched ``url?data=...``)."""
    redis_client.rpush(
        "fed:start_urls",
        json.dumps({"url": f"{site.url}/item/6", "meta": {"tag": "q"}, "data": "x 1"}),
    )
    crawler = get_crawler(FedSpider, settings(redis_url, HA_FEED=False))
    await crawler.crawl_async()
    assert crawler.spider.seen == [f"GET {site.url}/item/6?data=x+1 q"]
    posted = crawler.spider.make_request_from_data(
        json.dumps({"url": f"{site.url}/item/7", "method": "POST", "data": "x"}).encode()
    )
    assert (posted.method, posted.url, posted.body) == ("POST", f"{site.url}/item/7", b"data=x")
    with pytest.raises(ValueError, match='has a "body" and form fields'):
        crawler.spider.make_request_from_data(b'{"url": "http://a.test/", "body": "", "q": "1"}')


class ListingSpider(FedSpider):
    """Makes a list of requests of an entry, as scrapy-redis's make_request_from_data may."""

    def make_request_from_data(self, data):
        return [super().make_request_from_data(data)]


@deferred_f_from_coro_f
async def test_an_entry_made_into_a_list_is_dropped_saying_why(
    redis_url, redis_client, site, caplog
):
    """scrapy-redis takes an iterable from make_request_from_data; here an entry is one
    request, and a list was dropped as "'list' object has no attribute 'priority'"."""
    redis_client.rpush("fed:start_urls", f"{site.url}/item/8")
    crawler = get_crawler(ListingSpider, settings(redis_url, HA_FEED=False))
    await crawler.crawl_async()
    assert crawler.spider.seen == []
    assert crawler.stats.get_value("ha/start_urls_invalid") == 1
    assert (
        "make_request_from_data returned list, not one Request: each start URL entry is moved "
        "into the queue as exactly one request (scrapy-redis also took a list of them: push "
        "one entry per request instead)"
    ) in caplog.text


@deferred_f_from_coro_f
async def test_a_spider_of_scrapy_redis_is_named_at_open(redis_url, redis_client, site, caplog):
    """A moved project that kept ``from scrapy_redis.spiders import RedisSpider`` ran on the
    scheduler silently, its start URLs popped before their requests were stored (README
    said such spiders no longer start on Scrapy 2.16+: they do)."""
    from scrapy_redis.spiders import RedisSpider as ScrapyRedisSpider  # noqa: PLC0415

    class Moved(ScrapyRedisSpider):
        name = "moved"
        max_idle_time = 1

        def parse(self, response):
            yield {"url": response.url}

    crawler = get_crawler(Moved, settings(redis_url))
    await crawler.crawl_async()
    assert (
        "Spider moved is scrapy-redis's RedisSpider or RedisCrawlSpider: it pops its start "
        "URLs from Redis itself"
    ) in caplog.text
    caplog.clear()
    redis_client.rpush("fed:start_urls", f"{site.url}/item/9")
    crawler = get_crawler(FedSpider, settings(redis_url, HA_FEED=False))
    await crawler.crawl_async()
    assert "scrapy-redis's RedisSpider" not in caplog.text


class IdleTimedSpider(FedSpider):
    """Keeps scrapy-redis's spider attribute (it closed after 1 idle second there)."""

    max_idle_time = 1


@deferred_f_from_coro_f
async def test_scrapy_redis_max_idle_time_attribute_is_named_at_open(
    redis_url, redis_client, site, caplog
):
    """The attribute did nothing, silently: the worker waited for start URLs for ever."""
    crawler = get_crawler(IdleTimedSpider, settings(redis_url, HA_FEED=False))
    await crawler.crawl_async()
    assert (
        "Spider fed sets max_idle_time = 1, scrapy-redis's, which does nothing in scrapy-ha"
    ) in caplog.text
