"""Promises of the README and the reference, each through the public surface: ``dont_retry``,
``HA_RETRY_ENABLED = False``, the add-on leaving the project's own settings alone, and
``RedisCrawlSpider``."""

from __future__ import annotations

from typing import Any

import pytest
import scrapy
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import Rule
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.spiders import RedisCrawlSpider
from tests.test_retry_crawl import FAST_RETRIES

#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


class MetaSpider(scrapy.Spider):
    """Fetches (path, meta) pairs; records what reached the callback and the errback."""

    name = "meta"

    def __init__(self, base_url: str = "", requests: tuple = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base_url, self.requests = base_url, requests
        self.ok: list[str] = []
        self.errors: list[str] = []

    async def start(self) -> Any:
        for path, meta in self.requests:
            yield scrapy.Request(self.base_url + path, meta=meta, errback=self.on_error)

    def parse(self, response: Any) -> Any:
        self.ok.append(response.url.replace(self.base_url, ""))
        yield {"url": response.url}

    def on_error(self, failure: Any) -> None:
        self.errors.append(failure.request.url.replace(self.base_url, ""))


async def crawl_meta(redis_url: str, site: Any, requests: tuple, **settings: Any) -> Any:
    crawler = get_crawler(MetaSpider, {**FAST_RETRIES, "REDIS_URL": redis_url, **settings})
    await crawler.crawl_async(base_url=site.url, requests=requests)
    return crawler


@deferred_f_from_coro_f
async def test_dont_retry_sends_the_failure_to_the_errback_at_once(redis_url, redis_client, site):
    requests = (
        ("/flaky/1?fail=1&status=503", {"dont_retry": True}),
        ("/flaky/2?fail=1&status=503", {}),
    )
    crawler = await crawl_meta(redis_url, site, requests)
    hits = site.hits()
    assert hits["/flaky/1?fail=1&status=503"] == 1 and crawler.spider.errors == [
        "/flaky/1?fail=1&status=503"
    ]
    assert hits["/flaky/2?fail=1&status=503"] == 2 and crawler.spider.ok == [
        "/flaky/2?fail=1&status=503"
    ]
    assert redis_client.zcard("ha:{meta}:dead") == 0  # the spider had its say: not a dead letter


@deferred_f_from_coro_f
async def test_retry_disabled_retries_nothing(redis_url, redis_client, site):
    requests = (("/flaky/3?fail=1&status=503", {}), ("/status/404", {}))
    crawler = await crawl_meta(redis_url, site, requests, HA_RETRY_ENABLED=False)
    assert (
        site.hits()["/flaky/3?fail=1&status=503"] == 1
    )  # neither ours nor Scrapy's RetryMiddleware retried
    assert sorted(crawler.spider.errors) == ["/flaky/3?fail=1&status=503", "/status/404"]
    assert crawler.stats.get_value("ha/retry/server") is None


def test_the_addon_leaves_the_projects_own_settings_alone():
    crawler = get_crawler(
        scrapy.Spider,
        {
            "ADDONS": {"scrapy_ha.Addon": 0},
            "SCHEDULER": "scrapy.core.scheduler.Scheduler",
            "REMOTE_CONTROL_ENABLED": True,
            "DOWNLOADER_MIDDLEWARES": {
                "scrapy_ha.retry.RetryMiddleware": 560,
                "scrapy_ha.proxy.ProxyMiddleware": None,
                "scrapy.downloadermiddlewares.retry.RetryMiddleware": 500,
            },
            "SPIDER_MIDDLEWARES": {"scrapy_ha.checkpoint.CheckpointMiddleware": 123},
        },
    )
    crawler._apply_settings()
    settings = crawler.settings
    assert settings["SCHEDULER"] == "scrapy.core.scheduler.Scheduler"
    assert settings.getbool("REMOTE_CONTROL_ENABLED") is True
    downloader = settings.getwithbase("DOWNLOADER_MIDDLEWARES")
    assert downloader["scrapy_ha.retry.RetryMiddleware"] == 560
    assert downloader["scrapy_ha.proxy.ProxyMiddleware"] is None
    assert downloader["scrapy.downloadermiddlewares.retry.RetryMiddleware"] == 500
    assert downloader["scrapy_ha.useragent.UserAgentPoolMiddleware"] == 400  # what it adds
    spider = settings.getwithbase("SPIDER_MIDDLEWARES")
    assert spider["scrapy_ha.checkpoint.CheckpointMiddleware"] == 123
    assert spider["scrapy_ha.retry.ParseErrorMiddleware"] == 950


class FedCrawlSpider(RedisCrawlSpider):
    """A CrawlSpider fed from ``fedcrawl:start_urls``: follows list pages, parses items."""

    name = "fedcrawl"
    rules = (
        Rule(LinkExtractor(allow=r"/item/\d+$"), callback="parse_item"),
        Rule(LinkExtractor(allow=r"/list/")),
    )

    def parse_item(self, response: Any) -> Any:
        self.ids.append(int(response.css("span.id::text").get()))
        yield {"id": self.ids[-1]}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.ids: list[int] = []


@deferred_f_from_coro_f
async def test_redis_crawl_spider_follows_its_rules(redis_url, redis_client, site):
    redis_client.rpush("fedcrawl:start_urls", site.url + "/")
    crawler = get_crawler(
        FedCrawlSpider,
        {
            "ADDONS": {"scrapy_ha.Addon": 0},
            "REDIS_URL": redis_url,
            "HA_IDLE_TIMEOUT": 0.3,
            "HA_FEED": False,
        },
    )
    await crawler.crawl_async()
    assert sorted(crawler.spider.ids) == list(range(1, 51))  # 5 list pages of 10
    assert crawler.stats.get_value("item_scraped_count") == 50
    assert redis_client.llen("fedcrawl:start_urls") == 0
