"""A persisted crawl (``SCHEDULER_PERSIST = True``) started again crawls what is new: a task
whose checkpoint never says done, because its chain branches after its first page (its
checkpoint stays at the page before the branch, see the checkpoint middleware), must not
have its whole chain crawled again in every later run (a review: each run crawled every
page after the checkpoint again and re-emitted their items, without HA_CHECKPOINT_RERUN)."""

from __future__ import annotations

from typing import Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from tests.test_checkpoint_promises import crawl, saved
from tests.test_checkpoint_rerun_persisted import PERSIST, EveryRunSpider

#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


class BranchingSpider(EveryRunSpider):
    """Page 2 yields two next pages (3 and 4): the task branches there."""

    def parse(self, response: Any) -> Any:
        yield from super().parse(response)
        if response.url.endswith("/list/2"):
            yield response.follow("/list/4", callback=self.parse)


@deferred_f_from_coro_f
async def test_a_branched_task_is_not_crawled_again_in_each_later_run(
    redis_url, redis_client, site
):
    first = await crawl(redis_url, site, spider_cls=BranchingSpider, settings=PERSIST)
    assert sorted(first.spider.pages) == ["1", "2", "3", "4", "5"]
    assert saved(redis_client)["done"] is False  # at page 2, the branch: never done
    for _ in range(2):
        again = await crawl(redis_url, site, spider_cls=BranchingSpider, settings=PERSIST)
        # the task's start (its checkpointed page) again, as any dont_filter start request;
        # the pages after it were seen in the run before
        assert again.spider.pages == ["2"]
