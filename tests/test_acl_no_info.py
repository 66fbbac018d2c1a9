"""A crawl whose ACL user may not run ``INFO`` starts and crawls: docs/scaling.md says the
start-up check (and with it the back-pressure, which reads ``INFO memory``) is then
skipped, nothing else changes. A QA run: every worker of such a user stopped at start
(``scrapy-ha cannot start: ... no permissions to run the 'info' command``), as the first
call a worker makes, the check that Redis answers, was an ``INFO``. A real redis-server and
a real catalogue site."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import pytest
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.store.connection import check_reachable
from tests.spiders import CatalogueSpider

USER = "qa-no-info"


@pytest.fixture
def no_info_url(redis_url, redis_client):
    acl = ("on", f">{USER}", "~*", "&*", "+@all", "-info")
    redis_client.execute_command("ACL", "SETUSER", USER, *acl)
    parts = urlsplit(redis_url)
    try:
        yield urlunsplit(parts._replace(netloc=f"{USER}:{USER}@{parts.netloc}"))
    finally:
        redis_client.execute_command("ACL", "DELUSER", USER)


@deferred_f_from_coro_f
async def test_redis_that_refuses_info_to_the_user_is_reachable(no_info_url):
    client = redis.asyncio.Redis.from_url(no_info_url)
    try:
        assert await check_reachable(client, no_info_url, 5) == {}
    finally:
        await client.aclose()


@deferred_f_from_coro_f
async def test_a_crawl_as_a_user_without_info_crawls_every_page(no_info_url, site, caplog):
    settings = {"ADDONS": {"scrapy_ha.Addon": 0}, "HA_IDLE_TIMEOUT": 0.5, "REDIS_URL": no_info_url}
    crawler = get_crawler(CatalogueSpider, settings)
    await crawler.crawl_async(base_url=site.url)
    assert crawler.stats.get_value("finish_reason") == "finished"
    assert sorted(item["id"] for item in crawler.spider.items) == list(range(1, 51))
    assert crawler.stats.get_value("ha/acked") or crawler.stats.get_value("ha/leased")
    assert "cannot start" not in caplog.text


@deferred_f_from_coro_f
async def test_a_worker_without_info_says_its_back_pressure_is_off(no_info_url, caplog):
    """Back-pressure (HA_REDIS_MEMORY_HIGH, on by default) switched itself off for a user
    the ACL refuses INFO and said nothing: a worker that started where one before was
    refused, and then let Redis fill to its maxmemory unwarned."""
    from scrapy_ha.config.memory import MemoryConfig
    from scrapy_ha.scheduler.remote import Remote
    from scrapy_ha.scheduler.session.pressure import Pressure
    from scrapy_ha.store.sharding import make_queue

    client = redis.asyncio.Redis.from_url(no_info_url)
    try:
        queue = make_queue(client, "ha", "pressure", 1, worker="w0")
        pressure = Pressure(MemoryConfig(), get_crawler().stats, Remote(), "redis://x")
        with caplog.at_level("WARNING"):
            await pressure.check(queue, now=0.0, info={})
            await pressure.check(queue, now=1.0, info={})
    finally:
        await client.aclose()
    said = [r for r in caplog.records if "HA_REDIS_MEMORY_HIGH" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING", caplog.text
    assert "INFO" in said[0].getMessage()
