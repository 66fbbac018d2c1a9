"""A spider's own overrides of Scrapy's hooks (``start``, ``closed``...) are its machinery,
not callbacks: a payload written to Redis by someone else that names one is dead-lettered
as corrupt, and the hook does not run (a worker that called ``closed(response)`` mid-crawl
ran the spider's end-of-crawl code on a payload's word)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.codec import CodecError, decode_request
from scrapy_ha.keys import Keys
from tests import backqueues
from tests.spiders import CatalogueSpider

pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")

#: Scrapy's hooks a spider commonly overrides (``start``, ``update_settings``...) or
#: defines (``closed``, ``start_requests``), and the names its base classes give machinery.
HOOKS = ("start", "start_requests", "closed", "close", "_set_crawler", "handles_request")


class HookedSpider(CatalogueSpider):
    """The catalogue, with the hooks a real spider overrides."""

    name = "hooked"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hooks_run: list[str] = []

    async def start(self) -> Any:
        self.hooks_run.append("start")
        for url in self.start_urls:
            yield scrapy.Request(url)

    def start_requests(self) -> Any:  # (an older spider's)
        self.hooks_run.append("start_requests")
        return iter(())

    def closed(self, reason: Any) -> None:
        self.hooks_run.append(f"closed {reason!r}")

    def _set_crawler(self, crawler: Any) -> None:
        super()._set_crawler(crawler)


def payload(**fields: Any) -> bytes:
    return json.dumps({"v": 1, "u": "http://x/", **fields}).encode()


@pytest.mark.parametrize("name", HOOKS)
def test_a_hook_the_spider_overrides_is_no_callback(name):
    spider = HookedSpider(base_url="http://x")
    with pytest.raises(CodecError, match=f"no callback method '{name}'"):
        decode_request(payload(cb=name), spider)
    with pytest.raises(CodecError, match=f"no callback method '{name}'"):
        decode_request(payload(eb=name), spider)


def test_the_spiders_own_parse_and_methods_stay_callbacks():
    spider = HookedSpider(base_url="http://x")
    assert decode_request(payload(cb="parse_item"), spider).callback == spider.parse_item
    assert decode_request(payload(cb="parse"), spider).callback == spider.parse


@deferred_f_from_coro_f
async def test_payloads_naming_hooks_are_dead_lettered_and_the_hooks_do_not_run(
    redis_url, redis_client, site
):
    keys = Keys("ha", "hooked")
    planted = [
        ("900", payload(u=f"{site.url}/item/7", cb="closed")),
        ("901", payload(u=f"{site.url}/item/8", cb="start")),
        ("902", payload(u=f"{site.url}/item/9", cb="parse_item")),
    ]
    backqueues.plant(redis_client, keys, planted)
    settings = {
        "SCHEDULER": "scrapy_ha.Scheduler",
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.3,
        "SCHEDULER_PERSIST": True,
    }
    crawler = get_crawler(HookedSpider, settings)
    await crawler.crawl_async(base_url=site.url)
    spider = crawler.spider
    assert spider.hooks_run == ["start", "closed 'finished'"]  # once each, by Scrapy
    assert len(spider.items) == 51  # the catalogue's 50 and /item/9
    dead = {k.decode(): json.loads(v) for k, v in redis_client.hgetall(keys.dead_info).items()}
    assert {k: d["class"] for k, d in dead.items()} == {"900": "corrupt", "901": "corrupt"}
    assert "no callback method 'closed'" in dead["900"]["reason"]
    assert "no callback method 'start'" in dead["901"]["reason"]


#: List pages of the test site (tests/conftest.py).
LIST_PAGES = 5


class ListingsSpider(scrapy.spiders.CrawlSpider):
    """A CrawlSpider whose override of ``parse_start_url`` parses its list pages, reached
    from the start page and from each other with that callback: CrawlSpider's documented
    hook, called by Scrapy with a response, so a callback like any other."""

    name = "listings"
    rules = ()

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/list/1"]
        self.lists: list[str] = []

    def parse_start_url(self, response: Any) -> Any:
        self.lists.append(response.url)
        next_page = response.css("a.next::attr(href)").get()
        if next_page:
            yield response.follow(next_page, callback=self.parse_start_url)


def test_crawlspiders_parse_start_url_overridden_is_a_callback():
    spider = ListingsSpider(base_url="http://x")
    request = decode_request(payload(cb="parse_start_url"), spider)
    assert request.callback == spider.parse_start_url


@deferred_f_from_coro_f
async def test_a_crawl_through_parse_start_url_reaches_every_list_page(
    redis_url, redis_client, site
):
    keys = Keys("ha", "listings")
    # stored by a version that took it (before 2026-12-07): crawled, not dead-lettered
    planted = payload(u=f"{site.url}/list/3?planted=1", cb="parse_start_url")
    backqueues.plant(redis_client, keys, [("900", planted)])
    settings = {"SCHEDULER": "scrapy_ha.Scheduler", "REDIS_URL": redis_url, "HA_IDLE_TIMEOUT": 0.3}
    crawler = get_crawler(ListingsSpider, settings)
    await crawler.crawl_async(base_url=site.url)
    assert crawler.stats.get_value("log_count/ERROR", 0) == 0
    assert redis_client.hlen(keys.dead_info) == 0
    lists = crawler.spider.lists
    assert len(lists) == len(set(lists)) == LIST_PAGES + 1, lists  # and the planted one
