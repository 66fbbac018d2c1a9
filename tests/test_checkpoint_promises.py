"""Promises of the checkpoint reference, each through a real crawl (in-process, real Redis,
real site): a finished task is skipped unless ``HA_CHECKPOINT_RERUN``; ``meta["ha_task"] =
False`` opts a start request out; ``meta["ha_next_page"]`` marks the chain whatever the
callback; a checkpoint over ``HA_CHECKPOINT_MAX_BYTES`` is saved without the spider's
fields, with a warning."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha import metakeys
from scrapy_ha.codec import encode_request

NAME = "cp_promises"


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


class ChainSpider(scrapy.Spider):
    """The catalogue's list pages as one task; items straight from the list pages.

    *mark*: how the next page is yielded: ``"same"`` (the callback of its page, found
    without help), ``"marked"`` (another callback, ``ha_next_page = True``), ``"unmarked"``
    (another callback, no mark). *opt_out*: the start request has ``ha_task = False``.
    *big*: bytes of a custom checkpoint field."""

    name = NAME

    def __init__(
        self, base_url: str = "", mark: str = "same", opt_out: bool = False, big: int = 0, **kw: Any
    ) -> None:
        super().__init__(**kw)
        self.base_url, self.mark, self.opt_out, self.big = base_url, mark, opt_out, big
        self.ids: list[int] = []
        self.pages: list[str] = []

    async def start(self) -> Any:
        meta = {metakeys.TASK: False} if self.opt_out else {metakeys.TASK: "catalogue"}
        yield scrapy.Request(self.base_url + "/list/1", meta=meta)

    def parse(self, response: Any) -> Any:
        self.pages.append(response.url.rsplit("/", 1)[1])
        if self.big:
            response.meta[metakeys.CHECKPOINT]["note"] = "x" * self.big
        for href in response.css("a.item::attr(href)").getall():
            self.ids.append(int(href.rsplit("/", 1)[1]))
            yield {"id": int(href.rsplit("/", 1)[1])}
        next_page = response.css("a.next::attr(href)").get()
        if not next_page:
            return
        if self.mark == "same":
            yield response.follow(next_page, callback=self.parse)
        else:
            meta = {metakeys.NEXT_PAGE: True} if self.mark == "marked" else {}
            yield response.follow(next_page, callback=self.parse_more, meta=meta)

    def parse_more(self, response: Any) -> Any:
        yield from self.parse(response)


async def crawl(redis_url: str, site: Any, **kwargs: Any) -> Any:
    settings = {
        "ADDONS": {"scrapy_ha.Addon": 0},
        "REDIS_URL": redis_url,
        "HA_CHECKPOINTS": True,
        "HA_IDLE_TIMEOUT": 0.5,
        "LOG_LEVEL": "INFO",
        **kwargs.pop("settings", {}),
    }
    crawler = get_crawler(kwargs.pop("spider_cls", ChainSpider), settings)
    await crawler.crawl_async(base_url=site.url, **kwargs)
    return crawler


def saved(redis_client: Any) -> dict[str, Any] | None:
    raw = redis_client.get(f"ha:{{{NAME}}}:cp:catalogue")
    return json.loads(raw) if raw else None


@deferred_f_from_coro_f
async def test_a_finished_task_is_skipped_unless_rerun_is_set(redis_url, redis_client, site):
    first = await crawl(redis_url, site)
    assert sorted(first.spider.ids) == list(range(1, 51))
    assert saved(redis_client)["done"] is True
    again = await crawl(redis_url, site)
    assert again.spider.pages == []  # finished in an earlier run: skipped
    assert again.stats.get_value("ha/checkpoint/finished_skipped") == 1
    rerun = await crawl(redis_url, site, settings={"HA_CHECKPOINT_RERUN": True})
    assert rerun.spider.pages == ["1", "2", "3", "4", "5"]
    assert rerun.stats.get_value("ha/checkpoint/finished_skipped") is None


@deferred_f_from_coro_f
async def test_a_start_request_opted_out_saves_no_checkpoint(redis_url, redis_client, site):
    crawler = await crawl(redis_url, site, opt_out=True)
    assert sorted(crawler.spider.ids) == list(range(1, 51))
    assert redis_client.keys(f"ha:{{{NAME}}}:cp:*") == []
    assert crawler.stats.get_value("ha/checkpoint/saved") is None


@pytest.mark.parametrize(
    ("mark", "followed"),
    [("same", True), ("marked", True), ("unmarked", False)],
)
@deferred_f_from_coro_f
async def test_the_chain_is_the_same_callback_or_a_marked_request(
    redis_url, redis_client, site, mark, followed
):
    crawler = await crawl(redis_url, site, mark=mark)
    assert sorted(crawler.spider.ids) == list(range(1, 51))  # crawled either way
    cp = saved(redis_client)
    if followed:  # the task went along the chain to its last page
        assert cp["done"] is True and cp["page"] == 5 and cp["items"] == 50, cp
    else:  # page 2 is no next page: the task ended with page 1
        assert cp["done"] is True and cp["page"] == 1 and cp["items"] == 10, cp


@deferred_f_from_coro_f
async def test_a_checkpoint_over_the_size_limit_is_saved_without_its_fields_with_a_warning(
    redis_url, redis_client, site, caplog
):
    caplog.set_level(logging.WARNING, logger="scrapy_ha.middlewares.checkpoint")
    crawler = await crawl(redis_url, site, big=3000, settings={"HA_CHECKPOINT_MAX_BYTES": 2048})
    assert sorted(crawler.spider.ids) == list(range(1, 51))  # the crawl goes on
    cp = saved(redis_client)  # the task's progress and end, without the spider's fields
    assert cp["done"] is True and cp["fields"] == {} and cp["items"] == 50, cp
    assert cp["fields_dropped"] is True  # a resumed page says its fields are gone
    assert crawler.stats.get_value("ha/checkpoint/fields_dropped") == 5
    assert crawler.stats.get_value("ha/checkpoint/too_large") is None  # (saved)
    assert "over HA_CHECKPOINT_MAX_BYTES=2048" in caplog.text and "catalogue" in caplog.text
    redis_client.delete(f"ha:{{{NAME}}}:cp:catalogue")
    small = await crawl(redis_url, site, big=100)
    assert saved(redis_client)["fields"]["note"] == "x" * 100  # under the limit: saved
    assert small.stats.get_value("ha/checkpoint/too_large") is None


@deferred_f_from_coro_f
async def test_a_task_resumed_from_a_checkpoint_without_its_fields_says_so(
    redis_url, redis_client, site, caplog
):
    """A page resumed from a checkpoint saved without the spider's fields finds them empty:
    a WARNING says why (before, nothing told it from a task that never had any)."""
    caplog.set_level(logging.WARNING, logger="scrapy_ha.middlewares.storable")
    nxt = encode_request(scrapy.Request(site.url + "/list/5"), None).decode()
    doc = {"task": "catalogue", "of": 4, "page": 5, "items": 40, "fields": {}, "done": False}
    doc |= {"fields_dropped": True, "next": nxt}
    redis_client.set(f"ha:{{{NAME}}}:cp:catalogue", json.dumps(doc))
    crawler = await crawl(redis_url, site)
    assert crawler.spider.pages == ["5"]  # resumed at its checkpoint
    said = "Task catalogue resumes from a checkpoint saved without the spider's fields"
    assert said in caplog.text


class GrowingSpider(ChainSpider):
    """Its checkpoint field grows with each page: over 2,048 bytes from page 3 on."""

    def parse(self, response: Any) -> Any:
        page = int(response.url.rsplit("/", 1)[1])
        response.meta[metakeys.CHECKPOINT]["seen"] = "x" * (700 * page)
        yield from super().parse(response)


@deferred_f_from_coro_f
async def test_a_task_whose_checkpoint_outgrows_the_limit_is_done_when_it_ends(
    redis_url, redis_client, site
):
    """Before, the checkpoint of page 3 was not saved, every later page's waited behind it
    (kept aside), the task's end too: the task was never done, and every later run crawled
    it again from page 3 (with the item outbox, committing those pages' items again)."""
    limit = {"HA_CHECKPOINT_MAX_BYTES": 2048}
    first = await crawl(redis_url, site, spider_cls=GrowingSpider, settings=limit)
    assert first.spider.pages == ["1", "2", "3", "4", "5"]
    cp = saved(redis_client)
    assert cp["done"] is True and cp["items"] == 50, cp
    again = await crawl(redis_url, site, spider_cls=GrowingSpider, settings=limit)
    assert again.spider.pages == []  # done: skipped
    assert again.stats.get_value("ha/checkpoint/finished_skipped") == 1


class LongCursorSpider(ChainSpider):
    """Its next pages carry a long cursor in their query (an API's, a search's), with no
    field of its own: the next page's request is the checkpoint's bulk, twice the URL (its
    Referer too)."""

    def parse(self, response: Any) -> Any:
        for output in super().parse(response):
            if isinstance(output, scrapy.Request):
                output = output.replace(url=output.url + "?cursor=" + "c" * 1500)
            yield output


@deferred_f_from_coro_f
async def test_a_long_next_page_url_does_not_count_against_the_limit(redis_url, redis_client, site):
    """The limit is on what the spider keeps (its fields, the task's progress): a next page
    of a long URL was stored in the queue, its checkpoint refused from page 2 on (about
    3,400 bytes), and the task never done, crawled again by every later run."""
    first = await crawl(redis_url, site, spider_cls=LongCursorSpider)
    assert first.spider.pages[0] == "1" and len(first.spider.pages) == 5
    assert first.stats.get_value("ha/checkpoint/too_large") is None
    cp = saved(redis_client)
    assert cp["done"] is True and cp["items"] == 50, cp
    again = await crawl(redis_url, site, spider_cls=LongCursorSpider)
    assert again.spider.pages == []  # done: skipped


class AssigningSpider(ChainSpider):
    """Puts fields of its own in ``meta["ha_checkpoint"]`` in place of those it found (an API
    cursor kept as ``response.meta["ha_checkpoint"] = {...}``), or, with *value*, a value
    that is no dict."""

    def __init__(self, value: Any = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.value = value
        self.found: list[Any] = []

    def parse(self, response: Any) -> Any:
        self.found.append(response.meta.get(metakeys.CHECKPOINT))
        yield from super().parse(response)
        page = response.url.rsplit("/", 1)[1]
        fields = {"cursor": page} if self.value is None else self.value
        response.meta[metakeys.CHECKPOINT] = fields


@deferred_f_from_coro_f
async def test_fields_the_callback_puts_in_place_of_those_it_found_are_saved(
    redis_url, redis_client, site
):
    """A page's fields are those its callback leaves in meta, a dict of its own too: before,
    the middleware kept the dict the page came with, the spider's were never saved nor
    carried to the next page (the mid-page checkpoints took them, the page's own did not)."""
    settings = {"HA_CHECKPOINT_ITEMS": 4}
    crawler = await crawl(redis_url, site, spider_cls=AssigningSpider, settings=settings)
    assert sorted(crawler.spider.ids) == list(range(1, 51))
    assert crawler.spider.found == [{}, *({"cursor": str(n)} for n in range(1, 5))]
    assert saved(redis_client)["fields"] == {"cursor": "5"}
    assert saved(redis_client)["done"] is True


@deferred_f_from_coro_f
async def test_fields_that_are_no_dict_are_dropped_with_one_warning(
    redis_url, redis_client, site, caplog
):
    caplog.set_level(logging.WARNING, logger="scrapy_ha")
    settings = {"HA_CHECKPOINT_ITEMS": 4}
    crawler = await crawl(
        redis_url, site, spider_cls=AssigningSpider, value={1, 2}, settings=settings
    )
    assert sorted(crawler.spider.ids) == list(range(1, 51))
    assert crawler.spider.found == [{}] * 5
    assert saved(redis_client)["fields"] == {} and saved(redis_client)["done"] is True
    assert caplog.text.count("is a set, not a dict") == 1, caplog.text
    assert "not saved" not in caplog.text  # every checkpoint saved, mid-page ones too
    assert crawler.stats.get_value("ha/checkpoint/unencodable") is None
