"""``HA_CHECKPOINT_RERUN`` in a crawl kept in Redis (``SCHEDULER_PERSIST = True``) reruns a
finished task's whole chain. A QA run: the rerun crawled the task's first page only (its
next pages were filtered as seen in the run before), left the checkpoint at page 2, and
each later run crawled one page of the task again, re-emitting its items, for ever."""

from __future__ import annotations

from typing import Any

import pytest
import redis
import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha import metakeys
from tests.test_checkpoint_promises import ChainSpider, crawl, saved

#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")

PERSIST = {"SCHEDULER_PERSIST": True}


class EveryRunSpider(ChainSpider):
    """The chain's start request is ``dont_filter``: seeded again by each run."""

    async def start(self) -> Any:
        meta = {metakeys.TASK: "catalogue"}
        yield scrapy.Request(self.base_url + "/list/1", meta=meta, dont_filter=True)


@deferred_f_from_coro_f
async def test_a_rerun_of_a_persisted_crawl_crawls_the_whole_chain_and_ends_it(
    redis_url, redis_client, site
):
    first = await crawl(redis_url, site, spider_cls=EveryRunSpider, settings=PERSIST)
    assert first.spider.pages == ["1", "2", "3", "4", "5"]
    rerun = await crawl(
        redis_url,
        site,
        spider_cls=EveryRunSpider,
        settings={**PERSIST, "HA_CHECKPOINT_RERUN": True},
    )
    assert rerun.spider.pages == ["1", "2", "3", "4", "5"]  # before: ["1"]
    assert sorted(rerun.spider.ids) == list(range(1, 51))
    assert saved(redis_client)["done"] is True  # before: page 2 next
    after = await crawl(redis_url, site, spider_cls=EveryRunSpider, settings=PERSIST)
    assert after.spider.pages == []  # before: ["2"], then ["3"] the run after...
    assert after.stats.get_value("ha/checkpoint/finished_skipped") == 1
    # a rerun's chain is filtered within its run still: run again, each page once
    again = await crawl(
        redis_url,
        site,
        spider_cls=EveryRunSpider,
        settings={**PERSIST, "HA_CHECKPOINT_RERUN": True},
    )
    assert again.spider.pages == ["1", "2", "3", "4", "5"]


def test_a_rerun_resumed_from_its_checkpoint_goes_on_as_a_rerun():
    """A rerun killed mid-way resumes from its checkpoint in the next run still a rerun
    (its pages after seen in the runs before); a mark written otherwise is not one."""
    from scrapy_ha.middlewares.tasks import resume_state

    doc = {"page": 2, "items": 10, "next": "{}", metakeys.TASK_RERUN: True}
    assert resume_state(doc)[metakeys.TASK_RERUN] is True
    assert metakeys.TASK_RERUN not in resume_state({**doc, metakeys.TASK_RERUN: "yes"})


class LinkedAgain(ChainSpider):
    """A page of another task links to the chain's root once the chain is done, in the same
    run (a plain root: filtered as any request the run saw)."""

    async def start(self) -> Any:
        yield scrapy.Request(self.base_url + "/list/1", meta={metakeys.TASK: "catalogue"})

    def parse(self, response: Any) -> Any:
        yield from super().parse(response)
        if response.url.endswith("/list/5"):
            meta = {metakeys.TASK: False}
            yield scrapy.Request(self.base_url + "/list/3?other", meta=meta, callback=self.again)

    def again(self, response: Any) -> Any:
        """Once the task's checkpoint says done (saved when page 5 is acked): its root."""
        doc = saved(redis.Redis.from_url(self.settings["REDIS_URL"]))
        if not (doc and doc["done"]):  # not yet: this page again, until it is
            tries = response.meta.get("tries", 0) + 1
            assert tries < 1000, "the task's checkpoint never said done"
            meta = {metakeys.TASK: False, "tries": tries}
            yield response.request.replace(dont_filter=True, meta=meta)
            return
        yield scrapy.Request(self.base_url + "/list/1", meta={metakeys.TASK: "catalogue"})


@deferred_f_from_coro_f
async def test_a_task_done_in_this_run_and_met_again_is_not_rerun_in_it(redis_url, site):
    """A review: with HA_CHECKPOINT_RERUN, a task done in this run whose root a page linked
    to again was crawled twice in one run (100 items for 50): its root and chain were
    fingerprinted as a rerun's."""
    settings = {"HA_CHECKPOINT_RERUN": True, "CONCURRENT_REQUESTS": 1}
    crawler = await crawl(redis_url, site, spider_cls=LinkedAgain, settings=settings)
    assert crawler.spider.pages == ["1", "2", "3", "4", "5"]
    assert sorted(crawler.spider.ids) == list(range(1, 51))


@deferred_f_from_coro_f
async def test_a_plain_root_of_a_persisted_crawl_is_filtered_rerun_or_not(redis_url, site):
    """The docs: in a later run of a persisted crawl, a start request without dont_filter
    was seen and is filtered (``ha/start_filtered``): the task does not run again (a review:
    the rerun mark took the root out of the filter too)."""
    first = await crawl(redis_url, site, settings=PERSIST)
    assert first.spider.pages == ["1", "2", "3", "4", "5"]
    rerun = await crawl(redis_url, site, settings={**PERSIST, "HA_CHECKPOINT_RERUN": True})
    assert rerun.spider.pages == []
    assert rerun.stats.get_value("ha/start_filtered") == 1
