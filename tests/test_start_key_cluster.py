"""On a Redis Cluster, the start-URL key must share the crawl's hash tag (no cluster here:
the check is a unit test of the validation the scheduler runs at open)."""

from __future__ import annotations

import logging
import time

import pytest
import redis
import redis.asyncio
from scrapy import Spider
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.config.scheduler import DEFAULT_START_URLS_KEY
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.session.start_urls import CLUSTER_START_URLS_KEY, check_start_key
from scrapy_ha.store.url import uses_cluster
from tests.spiders import FedSpider

CRAWL_KEY = Keys("ha", "books").ready
CLUSTERS = [
    redis.RedisCluster,
    redis.asyncio.RedisCluster,
    "redis.cluster.RedisCluster",
    "redis.asyncio.cluster.RedisCluster",
]


def settings(redis_cls=None):
    return Settings({"REDIS_PARAMS": {"redis_cls": redis_cls}} if redis_cls else {})


@pytest.mark.parametrize("cls", CLUSTERS)
def test_a_default_start_key_is_refused_on_a_cluster_with_the_fix(cls):
    start_key = DEFAULT_START_URLS_KEY % {"name": "books"}
    with pytest.raises(ConfigError) as info:
        check_start_key(settings(cls), start_key, CRAWL_KEY)
    message = str(info.value)
    assert "'books:start_urls'" in message and "CROSSSLOT" in message
    assert 'REDIS_START_URLS_KEY = "{%(name)s}:start_urls"' in message


@pytest.mark.parametrize("cls", CLUSTERS)
def test_a_start_key_in_the_crawls_hash_tag_is_accepted_on_a_cluster(cls):
    check_start_key(settings(cls), CLUSTER_START_URLS_KEY % {"name": "books"}, CRAWL_KEY)


@pytest.mark.parametrize("cls", [None, redis.Redis, "redis.asyncio.Redis"])
def test_standalone_redis_keeps_scrapy_redis_default(cls):
    assert not uses_cluster(settings(cls))
    check_start_key(settings(cls), DEFAULT_START_URLS_KEY % {"name": "books"}, CRAWL_KEY)


def test_a_subclass_of_the_cluster_client_is_a_cluster():
    class MyCluster(redis.asyncio.RedisCluster):
        pass

    assert uses_cluster(settings(MyCluster))


@deferred_f_from_coro_f
async def test_the_scheduler_refuses_a_cluster_crawl_at_open_before_connecting(caplog):
    # port 9 (discard) has no Redis: the refusal comes before any connection is tried
    crawler = get_crawler(
        FedSpider,
        {
            "SCHEDULER": "scrapy_ha.Scheduler",
            "REDIS_URL": "redis://127.0.0.1:9/0",
            "REDIS_PARAMS": {"redis_cls": "redis.asyncio.RedisCluster"},
            "HA_CONNECT_TIMEOUT": 30,
        },
    )
    started = time.monotonic()
    await crawler.crawl_async()
    assert time.monotonic() - started < 20
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(
        "scrapy-ha cannot start" in e and "'fed:start_urls'" in e and "CROSSSLOT" in e
        for e in errors
    ), errors


@deferred_f_from_coro_f
async def test_a_start_urls_key_that_does_not_format_is_refused_naming_it(redis_url, caplog):
    """A QA run: ``REDIS_START_URLS_KEY = "%(nme)s:start"`` ended a RedisSpider's worker in
    four tracebacks and no finish reason; a spider that reads no start URLs from Redis
    does not read it (a review: refusing it there stopped crawls that never use it)."""
    bad = {"SCHEDULER": "scrapy_ha.Scheduler", "REDIS_URL": redis_url}
    bad["REDIS_START_URLS_KEY"] = "%(nme)s:start"
    crawler = get_crawler(FedSpider, bad)
    await crawler.crawl_async()
    assert crawler.stats.get_value("finish_reason") == "ha_start_failed"
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(
        "REDIS_START_URLS_KEY='%(nme)s:start' cannot be formatted with the spider's name" in e
        for e in errors
    ), errors
    plain = get_crawler(Spider, {**bad, "HA_IDLE_TIMEOUT": 0.3})
    await plain.crawl_async(name="plain")
    assert plain.stats.get_value("finish_reason") == "finished"
