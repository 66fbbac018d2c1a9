"""The item outbox in a crawl (``HA_ITEMS = "outbox"``): a page's items reach the item stream
with its ack, after the worker's pipelines; a page retried or dead-lettered commits none of
its items; an item that cannot be stored fails its page; with checkpoints, a page's
checkpoint goes with its items."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
import scrapy
from scrapy.exceptions import DropItem
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.codec.items import plain_item
from tests.spiders import ListItemsSpider

SETTINGS = {
    "ADDONS": {"scrapy_ha.Addon": 0},
    "HA_IDLE_TIMEOUT": 0.5,
    "HA_RETRY_JITTER": 0,
    "HA_RETRY_POLICIES": {"pipeline": {"base": 0.2}},
    "HA_ITEMS": "outbox",
    "LOG_LEVEL": "INFO",
}


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


def stream(redis_url: str, spider: str) -> list[Any]:
    client = redis.Redis.from_url(redis_url)
    try:
        return [plain_item(f[b"i"]) for _, f in client.xrange(f"ha:{{{spider}}}:items")]
    finally:
        client.close()


class Upper:
    """A worker pipeline that cleans items: what it returns is what the outbox holds."""

    def process_item(self, item: Any) -> Any:
        if item["id"] % 10 == 0:
            raise DropItem("every tenth item is invalid")
        return {**item, "clean": True}


@deferred_f_from_coro_f
async def test_every_item_reaches_the_stream_once_after_the_workers_pipelines(redis_url, site):
    settings = {**SETTINGS, "REDIS_URL": redis_url, "ITEM_PIPELINES": {f"{__name__}.Upper": 1}}
    crawler = get_crawler(ListItemsSpider, settings)
    await crawler.crawl_async(base_url=site.url)
    items = stream(redis_url, "list_items")
    assert sorted(i["id"] for i in items) == [i for i in range(1, 51) if i % 10]
    assert all(i["clean"] for i in items)
    stats = crawler.stats.get_stats()
    assert stats["ha/items/committed"] == 45
    assert "ha/items/refused" not in stats and "ha/items/discarded" not in stats


class FailsOnce:
    """A database down for one item: the page is retried (class pipeline)."""

    failed: set[int] = set()

    def process_item(self, item: Any) -> Any:
        if item["id"] == 7 and 7 not in self.failed:
            self.failed.add(7)
            raise ConnectionError("database is down")
        return item


@deferred_f_from_coro_f
async def test_a_retried_page_commits_its_items_once_from_the_run_that_is_acked(redis_url, site):
    FailsOnce.failed = set()
    settings = {
        **SETTINGS,
        "REDIS_URL": redis_url,
        "ITEM_PIPELINES": {f"{__name__}.FailsOnce": 1},
    }
    crawler = get_crawler(ListItemsSpider, settings)
    await crawler.crawl_async(base_url=site.url)
    ids = [i["id"] for i in stream(redis_url, "list_items")]
    assert sorted(ids) == list(range(1, 51))  # each once: the failed run's 9 were discarded
    stats = crawler.stats.get_stats()
    assert stats["ha/retry/pipeline"] == 1
    assert stats["ha/items/discarded"] == 9
    assert stats["ha/items/committed"] == 50


def _circular() -> dict[str, Any]:
    item: dict[str, Any] = {"tags": []}
    item["tags"].append(item)  # a back-reference: RecursionError, not a CodecError
    return item


#: Items the codec cannot store, and what encoding them raises.
UNSTORABLE = {
    "object": lambda: {"handle": object()},  # no faithful form: CodecError
    "circular": _circular,  # RecursionError
    "huge_int": lambda: {"big": 7**6000},  # ValueError: over Python's 4,300 digits
}


class Unstorable(scrapy.Spider):
    name = "unstorable_items"

    def __init__(self, base_url: str = "", kind: str = "object", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/list/1", base_url + "/list/2"]
        self.kind = kind

    def parse(self, response: Any) -> Any:
        yield {"page": response.url, "n": 1}
        if response.url.endswith("/list/2"):
            yield {"page": response.url, "n": 2, **UNSTORABLE[self.kind]()}


@pytest.mark.parametrize("kind", sorted(UNSTORABLE))
@deferred_f_from_coro_f
async def test_an_item_that_cannot_be_stored_fails_its_page(redis_url, site, kind):
    crawler = get_crawler(Unstorable, {**SETTINGS, "REDIS_URL": redis_url})
    await crawler.crawl_async(base_url=site.url, kind=kind)
    items = stream(redis_url, "unstorable_items")
    assert items == [{"page": f"{site.url}/list/1", "n": 1}]  # nothing of page 2
    stats = crawler.stats.get_stats()
    assert stats["ha/items/unstorable"] == 1
    assert stats["ha/dead/unstorable"] == 1
    client = redis.Redis.from_url(redis_url)
    (info,) = client.hvals("ha:{unstorable_items}:dead_info")
    assert "item" in json.loads(info)["reason"]
    client.close()


class StartItems(scrapy.Spider):
    name = "start_items"

    async def start(self) -> Any:
        yield {"from": "start"}


@deferred_f_from_coro_f
async def test_items_no_page_yielded_go_to_the_stream_on_their_own(redis_url):
    crawler = get_crawler(StartItems, {**SETTINGS, "REDIS_URL": redis_url})
    await crawler.crawl_async()
    assert stream(redis_url, "start_items") == [{"from": "start"}]
    assert crawler.stats.get_value("ha/items/no_page") == 1


class Task(ListItemsSpider):
    name = "task_items"

    async def start(self) -> Any:
        yield scrapy.Request(self.start_urls[0], meta={"ha_task": "list"})


@deferred_f_from_coro_f
async def test_a_pages_checkpoint_goes_with_its_items_and_none_is_mid_page(redis_url, site):
    settings = {
        **SETTINGS,
        "REDIS_URL": redis_url,
        "HA_CHECKPOINTS": True,
        "HA_CHECKPOINT_ITEMS": 2,  # would save every 2 items without the outbox
    }
    crawler = get_crawler(Task, settings)
    await crawler.crawl_async(base_url=site.url)
    assert sorted(i["id"] for i in stream(redis_url, "task_items")) == list(range(1, 51))
    client = redis.Redis.from_url(redis_url)
    doc = json.loads(client.get("ha:{task_items}:cp:list"))
    client.close()
    assert (doc["done"], doc["items"], doc["page"]) == (True, 50, 5)
    stats = crawler.stats.get_stats()
    assert stats["ha/checkpoint/saved"] == 5  # one per page, each with its ack
    assert "ha/checkpoint/stale" not in stats


class HeavyItems(scrapy.Spider):
    """Page 2 yields 5 items of 20 KB, past a limit of 50 KB for a page's items."""

    name = "heavy_items"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/list/1", base_url + "/list/2"]

    def parse(self, response: Any) -> Any:
        yield {"page": response.url, "n": 0}
        if response.url.endswith("/list/2"):
            for n in range(1, 6):
                yield {"page": response.url, "n": n, "blob": "x" * 20_000}


@deferred_f_from_coro_f
async def test_a_page_whose_items_pass_what_one_call_takes_fails_whole(
    redis_url, site, monkeypatch
):
    """Its items went to Redis whole with its ack: a page of 1 GB of items was sent again
    and again, never acked (a QA run). Past PAGE_ITEMS_MAX_BYTES it is dead-lettered as
    unstorable, with one ERROR, and the other pages' items are committed."""
    monkeypatch.setattr("scrapy_ha.scheduler.items.PAGE_ITEMS_MAX_BYTES", 50_000)
    crawler = get_crawler(HeavyItems, {**SETTINGS, "REDIS_URL": redis_url})
    await crawler.crawl_async(base_url=site.url)
    assert stream(redis_url, "heavy_items") == [{"page": f"{site.url}/list/1", "n": 0}]
    stats = crawler.stats.get_stats()
    assert stats["ha/items/unstorable"] == 1
    assert stats["ha/dead/unstorable"] == 1
    client = redis.Redis.from_url(redis_url)
    (info,) = client.hvals("ha:{heavy_items}:dead_info")
    assert "its page's items pass 50,000 bytes" in json.loads(info)["reason"]
    client.close()
