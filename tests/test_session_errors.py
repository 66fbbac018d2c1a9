"""The background task never dies silently: garbage in a key of the crawl, set aside by two
workers at once, stops neither (the rename of one found the key gone: "no such key", and the
task that talks to Redis ended, leaving the engine waiting for ever with its leases renewed);
and if the task ever ends on an error it did not catch, the crawl does not wait for ever: the
task is started again, and the spider closed with an error if it keeps dying. In-process
crawls of the demo site, a real Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio
import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.session.session import Session
from scrapy_ha.store.queue import RedisQueue

#: A crawl of the small site takes about a second; one that hangs is cut at this.
BOUND = 60


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


class ListSpider(scrapy.Spider):
    name = "errors"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/list/1"]
        self.ids: list[int] = []

    def parse(self, response: Any) -> Any:
        yield from response.follow_all(css="a.item", callback=self.parse_item)
        yield from response.follow_all(css="a.next")

    def parse_item(self, response: Any) -> Any:
        self.ids.append(int(response.css("span.id::text").get()))


def _crawler(redis_url: str) -> Any:
    return get_crawler(
        ListSpider,
        {
            "SCHEDULER": "scrapy_ha.Scheduler",
            "REDIS_URL": redis_url,
            "HA_IDLE_TIMEOUT": 0.3,
            "LOG_LEVEL": "INFO",
        },
    )


@deferred_f_from_coro_f
async def test_workers_setting_the_same_garbage_aside_at_once_rename_it_once(redis_url):
    keys = Keys("ha", "garbage")
    clients = [redis.asyncio.Redis.from_url(redis_url) for _ in range(8)]
    queues = [RedisQueue(client, keys) for client in clients]
    try:
        await clients[0].set(keys.delayed_score, "a string where a hash belongs")
        moved = await asyncio.gather(*(q.set_aside_wrong_types() for q in queues))
        assert sorted(len(m) for m in moved) == [0] * 7 + [1]
        assert len(await clients[0].keys(keys.delayed_score + ":corrupt:*")) == 1
        # the right type written meanwhile is never renamed
        await clients[0].hset(keys.delayed_score, "1", "5")
        assert await queues[1].set_aside_wrong_types() == []
        await clients[0].set(keys.delayed_score, "garbage again, the same second")
        await queues[0].set_aside_wrong_types()
        assert len(await clients[0].keys(keys.delayed_score + ":corrupt:*")) == 2  # kept
    finally:
        for client in clients:
            await client.aclose()


@deferred_f_from_coro_f
async def test_a_failure_to_set_garbage_aside_does_not_stop_the_crawl(redis_url, site, monkeypatch):
    from scrapy_ha.scheduler.session import ends as _ends

    calls = {"n": 0}
    real_sync, real_bad = RedisQueue.sync, _ends.Ends.bad_data

    async def sync(self: RedisQueue, **call: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:  # a round's sync meets garbage...
            raise redis.exceptions.ResponseError("WRONGTYPE Operation against a key")
        return await real_sync(self, **call)

    async def bad_data(self: Any, exc: Exception) -> None:
        if calls["n"] == 3:  # ...and another worker had renamed it first
            calls["n"] += 1
            raise redis.exceptions.ResponseError("no such key")
        await real_bad(self, exc)

    monkeypatch.setattr(RedisQueue, "sync", sync)
    monkeypatch.setattr(_ends.Ends, "bad_data", bad_data)
    crawler = _crawler(redis_url)
    await asyncio.wait_for(crawler.crawl_async(base_url=site.url), BOUND)
    assert sorted(crawler.spider.ids) == list(range(1, 51))
    assert crawler.stats.get_value("finish_reason") == "finished"


class Bug(BaseException):
    """Not an Exception: nothing in the background loop catches it."""


def rounds_fail(monkeypatch: Any, failing: Any) -> None:
    """Make the rounds numbered by *failing* (a predicate) end the background task."""
    rounds = {"n": 0}
    real_round = Session._round

    async def round_(self: Session) -> bool:
        rounds["n"] += 1
        if failing(rounds["n"]):
            raise Bug(f"a bug in round {rounds['n']}")
        return await real_round(self)

    monkeypatch.setattr(Session, "_round", round_)


@deferred_f_from_coro_f
async def test_a_background_task_that_dies_is_started_again(redis_url, site, monkeypatch):
    rounds_fail(monkeypatch, lambda n: n == 3)
    crawler = _crawler(redis_url)
    await asyncio.wait_for(crawler.crawl_async(base_url=site.url), BOUND)
    assert sorted(crawler.spider.ids) == list(range(1, 51))
    assert crawler.stats.get_value("finish_reason") == "finished"
    assert crawler.stats.get_value("ha/task_failed") == 1


@deferred_f_from_coro_f
async def test_a_background_task_that_keeps_dying_closes_the_spider(redis_url, site, monkeypatch):
    rounds_fail(monkeypatch, lambda n: n >= 3)
    crawler = _crawler(redis_url)
    await asyncio.wait_for(crawler.crawl_async(base_url=site.url), BOUND)
    assert crawler.stats.get_value("finish_reason") == "scrapy_ha_error"
    assert crawler.stats.get_value("ha/task_failed") == 3


class Corrupting(ListSpider):
    """Writes garbage in place of a key the lease renewals read, on its first page, and
    waits there until the worker has set the key aside (or :data:`BOUND` passed)."""

    name = "renewing"
    bad_key = "workers"
    set_aside = False

    async def parse(self, response: Any) -> Any:
        if response.url.endswith("/list/1"):
            keys = Keys("ha", self.name)
            client = redis.asyncio.Redis.from_url(self.settings["REDIS_URL"])
            try:
                await client.delete(getattr(keys, self.bad_key))
                await client.set(getattr(keys, self.bad_key), "garbage")
                pattern = getattr(keys, self.bad_key) + ":corrupt:*"
                for _ in range(BOUND * 10):
                    if await client.keys(pattern):
                        type(self).set_aside = True
                        break
                    await asyncio.sleep(0.1)
            finally:
                await client.aclose()
        for request in super().parse(response):
            yield request


@pytest.mark.parametrize("bad_key", ["workers", "seen"])
@deferred_f_from_coro_f
async def test_garbage_in_a_key_the_renewals_read_is_set_aside(redis_url, site, bad_key):
    """A QA run: ``SET ha:{qa}:workers junk`` mid-crawl; every renewal failed (WRONGTYPE,
    taken for a Redis down), the key was never set aside, and the crawl stalled for good."""
    Corrupting.bad_key, Corrupting.set_aside = bad_key, False
    settings = {
        "SCHEDULER": "scrapy_ha.Scheduler",
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.3,
        "HA_LEASE_TIME": 4,
        "HA_LEASE_RENEW_INTERVAL": 0.5,
    }
    crawler = get_crawler(Corrupting, settings)
    await asyncio.wait_for(crawler.crawl_async(base_url=site.url), BOUND * 2)
    assert Corrupting.set_aside
    assert sorted(crawler.spider.ids) == list(range(1, 51))
    assert crawler.stats.get_value("finish_reason") == "finished"
    assert crawler.stats.get_value("ha/corrupt_keys") >= 1


@pytest.mark.parametrize("bad_key", ["dead", "workers", "run", "domain_limits", "senders", "seen"])
@deferred_f_from_coro_f
async def test_garbage_in_a_key_read_at_start_is_set_aside(redis_url, site, bad_key):
    """A QA run: ``SET ha:{qa}:dead junk`` (or workers, run, limits...) before a worker
    started: it stopped at start (ha_start_failed), on Redis's WRONGTYPE naming no key."""
    keys = Keys("ha", ListSpider.name)
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await client.set(getattr(keys, bad_key), "garbage")
        crawler = _crawler(redis_url)
        await asyncio.wait_for(crawler.crawl_async(base_url=site.url), BOUND)
        assert crawler.stats.get_value("finish_reason") == "finished"
        assert sorted(crawler.spider.ids) == list(range(1, 51))
        assert await client.keys(getattr(keys, bad_key) + ":corrupt:*")
    finally:
        await client.aclose()


@deferred_f_from_coro_f
async def test_garbage_in_the_stop_key_is_no_stop(redis_url, site, caplog):
    """A QA run: ``SET ha:{qa}:stop junk``; the worker stopped at start, "invalid literal
    for int() ... (check REDIS_URL)"."""
    keys = Keys("ha", ListSpider.name)
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await client.set(keys.stop, "junk")
        crawler = _crawler(redis_url)
        await asyncio.wait_for(crawler.crawl_async(base_url=site.url), BOUND)
        assert crawler.stats.get_value("finish_reason") == "finished"
        assert sorted(crawler.spider.ids) == list(range(1, 51))
        assert f"{keys.stop} holds b'junk', no time `scrapy-ha stop` writes" in caplog.text
    finally:
        await client.aclose()
