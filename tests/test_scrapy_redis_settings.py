"""A project moved from scrapy-redis keeps scrapy-redis's settings: those scrapy-ha does not
read are named at start with what does their job here, and a start URL key of another type
than the one the worker reads (scrapy-redis's sorted set, ``REDIS_START_URLS_AS_ZSET``) is
named with the fix while the crawl goes on. Before (a QA run), the settings did nothing
silently, and the sorted set failed every round of the worker with "Redis refused a
scrapy-ha command (WRONGTYPE ...)": it crawled nothing, not even the requests the crawl
held, and never closed."""

from __future__ import annotations

import logging
import subprocess
from typing import TYPE_CHECKING

from scrapy import Spider
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.scheduler.shell import Scheduler
from tests.cli_seed import scrapy_ha
from tests.scrapy_project import crawl, write_project
from tests.spiders import FaultSpider

if TYPE_CHECKING:
    from pathlib import Path

SPIDERS = """
from scrapy_ha.spiders import RedisSpider


class Feed(RedisSpider):
    name = "feed"

    def parse(self, response):
        yield {"url": response.url}
"""


def test_scrapy_redis_settings_scrapy_ha_does_not_read_are_named_at_start(caplog):
    given = {
        "SCHEDULER_QUEUE_CLASS": "scrapy_redis.queue.FifoQueue",
        "SCHEDULER_IDLE_BEFORE_CLOSE": 10,
        "SCHEDULER_SERIALIZER": "json",
        "REDIS_START_URLS_AS_ZSET": True,
        "SCHEDULER_PERSIST": True,  # read: not named
        "REDIS_START_URLS_AS_SET": False,
    }
    with caplog.at_level(logging.WARNING):
        Scheduler.from_crawler(get_crawler(Spider, given))
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [
        "SCHEDULER_QUEUE_CLASS is scrapy-redis's and does nothing in scrapy-ha: the order "
        "within a priority is HA_QUEUE_ORDER ('lifo' or 'fifo')",
        "SCHEDULER_SERIALIZER is scrapy-redis's and does nothing in scrapy-ha: requests are "
        "stored as versioned JSON, never pickled",
        "SCHEDULER_IDLE_BEFORE_CLOSE is scrapy-redis's and does nothing in scrapy-ha: an idle "
        "worker waits HA_IDLE_TIMEOUT (HA_FEED: for ever)",
        "REDIS_START_URLS_AS_ZSET is scrapy-redis's and does nothing in scrapy-ha: start URLs "
        "are read from a list, or a set with REDIS_START_URLS_AS_SET = True; a sorted set is "
        "not read (move its members into a list)",
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        Scheduler.from_crawler(get_crawler(Spider, {"REDIS_START_URLS_AS_ZSET": False}))
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_a_start_key_of_another_type_is_named_and_the_crawl_goes_on(
    tmp_path: Path, redis_url, redis_client, site
):
    project = write_project(
        tmp_path / "proj",
        "moved",
        SPIDERS,
        f'REDIS_URL = "{redis_url}"\nREDIS_START_URLS_AS_ZSET = True\nHA_IDLE_TIMEOUT = 0\n',
    )
    redis_client.zadd("feed:start_urls", {f"{site.url}/list/1": 1})  # scrapy-redis's zset
    pushed = scrapy_ha("push", "feed", f"{site.url}/list/2", "--create", cwd=project)
    assert pushed.returncode == 0, pushed.stderr
    log = tmp_path / "worker.log"
    worker = crawl(project, "feed", log, settings={"HA_FEED": "False"})
    try:
        assert worker.wait(timeout=60) == 0, log.read_text()
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()
        raise AssertionError("the worker never closed:\n" + log.read_text()[-3000:]) from None
    text = log.read_text()
    assert "'item_scraped_count': 1," in text, text[-3000:]  # the request the crawl held
    assert (
        "Start URL key feed:start_urls is a zset, not the list this worker reads "
        "(REDIS_START_URLS_AS_SET=False)"
    ) in text
    assert "WRONGTYPE" not in text
    assert redis_client.zcard("feed:start_urls") == 1  # left as it was


def test_scrapy_redis_max_idle_time_is_named_at_start(caplog):
    """scrapy-redis's spiders close after MAX_IDLE_TIME_BEFORE_CLOSE idle seconds; a
    RedisSpider of scrapy-ha (HA_FEED) waited for ever, silently (a QA run: a worker of a
    moved project set to 6 s never closed). 0, scrapy-redis's default, waits for ever too."""
    with caplog.at_level(logging.WARNING):
        Scheduler.from_crawler(get_crawler(Spider, {"MAX_IDLE_TIME_BEFORE_CLOSE": 6}))
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [
        "MAX_IDLE_TIME_BEFORE_CLOSE is scrapy-redis's and does nothing in scrapy-ha: a "
        "RedisSpider waits for start URLs for ever (HA_FEED); with HA_FEED = False it closes "
        "once the crawl is empty (after HA_IDLE_TIMEOUT while other workers live)"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        Scheduler.from_crawler(get_crawler(Spider, {"MAX_IDLE_TIME_BEFORE_CLOSE": 0}))
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


@deferred_f_from_coro_f
async def test_requests_left_in_scrapy_redis_queue_are_named_at_start(
    redis_url, redis_client, site, caplog
):
    """A project that changed SCHEDULER in the middle of a persisted scrapy-redis crawl:
    the requests scrapy-redis's queue holds are never crawled (scrapy-ha reads its own
    keys, and no pickle). Before, nothing said so."""
    redis_client.zadd("faults:requests", {b"\x80\x04pickled-1": -1, b"\x80\x04pickled-2": 0})
    settings = {
        "ADDONS": {"scrapy_ha.Addon": 0},
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.3,
    }
    with caplog.at_level(logging.WARNING):
        crawler = get_crawler(FaultSpider, settings)
        await crawler.crawl_async(base_url=site.url, paths=("/item/1",))
    assert crawler.spider.ok == ["/item/1"]
    warned = [r.getMessage() for r in caplog.records if "scrapy-redis's queue" in r.getMessage()]
    assert warned == [
        "scrapy-redis's queue faults:requests holds 2 request(s) that scrapy-ha does not "
        "read: this crawl will not fetch them. Finish them with scrapy-redis's scheduler "
        "first, or push their URLs with `scrapy-ha push faults URL...`; delete the key once "
        "they no longer matter (README, 'Coming from scrapy-redis')"
    ]
    assert redis_client.zcard("faults:requests") == 2  # left alone
    caplog.clear()
    redis_client.delete("faults:requests")
    redis_client.rpush("queue:faults", b"\x80\x04pickled")  # a list, at its own key
    with caplog.at_level(logging.WARNING):
        crawler = get_crawler(FaultSpider, {**settings, "SCHEDULER_QUEUE_KEY": "queue:%(spider)s"})
        await crawler.crawl_async(base_url=site.url, paths=("/item/2",))
    warned = [r.getMessage() for r in caplog.records if "scrapy-redis's queue" in r.getMessage()]
    assert [w.split(" that ")[0] for w in warned] == [
        "scrapy-redis's queue queue:faults holds 1 request(s)"
    ]
