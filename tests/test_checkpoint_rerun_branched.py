"""A persisted crawl (``SCHEDULER_PERSIST = True``) started again crawls what is new: a task
whose checkpoint never says done, because its chain branches after its first page (its
checkpoint stays at the page before the branch, see the checkpoint middleware), must not
have its whole chain crawled again in every later run (a review: each run crawled every
page after the checkpoint again and re-emitted their items, without HA_CHECKPOINT_RERUN)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f

from tests.test_checkpoint_promises import NAME, crawl, saved
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


@deferred_f_from_coro_f
async def test_a_branched_task_of_a_version_before_is_not_crawled_again_in_each_run(
    redis_url, redis_client, site
):
    """Its checkpoint records no run (a version before 2026-12-06): taken for a rerun that
    version may have left mid-way, until the chain branches; the branches' pages are then
    filtered as any (before: every page after the branch crawled again in every run)."""
    first = await crawl(redis_url, site, spider_cls=BranchingSpider, settings=PERSIST)
    assert sorted(first.spider.pages) == ["1", "2", "3", "4", "5"]
    doc = saved(redis_client)
    del doc["run"]  # as that version saved it
    redis_client.set(f"ha:{{{NAME}}}:cp:catalogue", json.dumps(doc))
    for _ in range(2):
        again = await crawl(redis_url, site, spider_cls=BranchingSpider, settings=PERSIST)
        assert again.spider.pages == ["2"]


def test_a_guessed_rerun_ends_where_its_chain_branches_a_said_one_does_not():
    from scrapy_ha import metakeys
    from scrapy_ha.middlewares.tasks import branch, resume_state

    doc = {"page": 2, "items": 10, "next": "{}"}
    guessed = resume_state(doc, rerun=True)
    assert guessed[metakeys.TASK_RERUN] == metakeys.RERUN_GUESSED
    # saved since by the guessed chain: still guessed when resumed again
    saved_since = {**doc, metakeys.TASK_RERUN: metakeys.RERUN_GUESSED, "run": 3}
    assert resume_state(saved_since)[metakeys.TASK_RERUN] == metakeys.RERUN_GUESSED
    branch(guessed)
    assert metakeys.TASK_RERUN not in guessed and guessed["branched"] is True
    said = resume_state({**doc, metakeys.TASK_RERUN: True}, rerun=True)
    branch(said)
    assert said[metakeys.TASK_RERUN] is True  # HA_CHECKPOINT_RERUN's: every branch
    # saved by a rerun in a run before: guessed (its chain may have branched then)
    later = resume_state({**doc, metakeys.TASK_RERUN: True, "run": 1}, earlier=True)
    assert later[metakeys.TASK_RERUN] == metakeys.RERUN_GUESSED


@deferred_f_from_coro_f
async def test_a_rerun_whose_chain_branches_is_not_rerun_in_every_later_run(
    redis_url, redis_client, site
):
    """A task done in a run (its chain did not branch then), run again (HA_CHECKPOINT_RERUN)
    when its chain branches: its checkpoint, never done, stays at the branch marked as a
    rerun's. The runs after, without HA_CHECKPOINT_RERUN, resume it there as a branched
    task that is no rerun (before: as a rerun, every branch crawled again in every run)."""
    first = await crawl(redis_url, site, spider_cls=EveryRunSpider, settings=PERSIST)
    assert first.spider.pages == ["1", "2", "3", "4", "5"]
    assert saved(redis_client)["done"] is True
    rerun = {**PERSIST, "HA_CHECKPOINT_RERUN": True}
    again = await crawl(redis_url, site, spider_cls=BranchingSpider, settings=rerun)
    assert sorted(again.spider.pages) == ["1", "2", "3", "4", "5"]
    assert saved(redis_client)["done"] is False  # at page 2, the branch
    for _ in range(2):
        later = await crawl(redis_url, site, spider_cls=BranchingSpider, settings=PERSIST)
        assert later.spider.pages == ["2"]  # before: ["2", "3", "4", "5"] in each run
