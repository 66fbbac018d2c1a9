"""A worker without the item outbox in a crawl whose sinks are declared says so at start:
the items it scrapes reach none of them. Found deploying to scrapyd: a job scheduled without
``-d setting=HA_ITEMS=outbox`` beside jobs with it scraped 399 of a crawl's 800 items into
no sink, and nothing (its log, ``scrapy-ha status``) said why the sinks held 401."""

from __future__ import annotations

import logging
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from tests.spiders import ListItemsSpider

SETTINGS = {"ADDONS": {"scrapy_ha.Addon": 0}, "HA_IDLE_TIMEOUT": 0.5, "LOG_LEVEL": "INFO"}
SAID = "reach none of them"

pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


def declare(redis_url: str, group: str) -> None:
    """What ``scrapy-ha items list_items --to ... --declare`` leaves in Redis."""
    client = redis.Redis.from_url(redis_url)
    try:
        client.xgroup_create("ha:{list_items}:items", group, id="0", mkstream=True)
    finally:
        client.close()


async def crawl(redis_url: str, site_url: str, **settings: object) -> dict[str, object]:
    crawler = get_crawler(ListItemsSpider, {**SETTINGS, "REDIS_URL": redis_url, **settings})
    await crawler.crawl_async(base_url=site_url)
    return crawler.stats.get_stats()


@deferred_f_from_coro_f
async def test_a_worker_without_the_outbox_names_the_sinks_it_does_not_feed(
    redis_url, site, caplog
):
    declare(redis_url, "jsonl:/srv/items.jl")
    caplog.set_level(logging.INFO)
    stats = await crawl(redis_url, site.url)
    assert stats["item_scraped_count"] == 50  # scraped: into the worker's pipelines alone
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    said = [m for m in warnings if SAID in m]
    assert len(said) == 1, warnings
    assert "jsonl:/srv/items.jl" in said[0] and 'HA_ITEMS = "outbox"' in said[0]


@deferred_f_from_coro_f
async def test_no_word_with_the_outbox_or_without_a_sink(redis_url, site, caplog):
    caplog.set_level(logging.INFO)
    await crawl(redis_url, site.url)  # no sink declared: the outbox is simply not used
    declare(redis_url, "jsonl:/srv/items.jl")
    stats = await crawl(redis_url, site.url, HA_ITEMS="outbox")
    assert stats["ha/items/committed"] == 50
    assert SAID not in caplog.text


@deferred_f_from_coro_f
async def test_a_user_the_acl_refuses_xinfo_crawls_without_the_word(redis_url, redis_client, site):
    """docs/scaling.md lets an ACL user be narrowed to the commands of the worker's scripts,
    which read no consumer group: such a worker is not stopped by the check."""
    redis_client.execute_command("ACL", "SETUSER", "no-xinfo", "on", ">pw", "~*", "&*")
    redis_client.execute_command("ACL", "SETUSER", "no-xinfo", "+@all", "-xinfo")
    declare(redis_url, "jsonl:/srv/items.jl")
    parts = urlsplit(redis_url)
    user_url = urlunsplit(parts._replace(netloc=f"no-xinfo:pw@{parts.netloc}"))
    try:
        stats = await crawl(user_url, site.url)
    finally:
        redis_client.execute_command("ACL", "DELUSER", "no-xinfo")
    assert stats["finish_reason"] == "finished" and stats["item_scraped_count"] == 50
