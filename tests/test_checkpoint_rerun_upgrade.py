"""A persisted crawl whose checkpoints the version before 2026-12-06 left mid-chain (its
``HA_CHECKPOINT_RERUN`` crawled a finished task's first page only and saved the second as
next, with no run recorded): a QA run of a rolling upgrade found the new version resuming
such a task one page per run, for ever (its next page filtered as seen in the runs before),
re-emitting that page's items each run, with or without ``HA_CHECKPOINT_RERUN``."""

from __future__ import annotations

import json
from typing import Any

import pytest
import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.codec import encode_request
from tests.test_checkpoint_promises import NAME, crawl, saved
from tests.test_checkpoint_rerun_persisted import PERSIST, EveryRunSpider

#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


def left_by_the_version_before(site: Any) -> dict[str, Any]:
    """What that version saved after its rerun of the chain: page 2 next, no ``run``."""
    page = scrapy.Request(site.url + "/list/2", callback=EveryRunSpider.parse)
    nxt = encode_request(page, EveryRunSpider(base_url=site.url)).decode()
    return {"task": "catalogue", "page": 2, "items": 10, "fields": {}, "done": False, "next": nxt}


@deferred_f_from_coro_f
async def test_a_chain_left_mid_way_by_an_earlier_run_is_finished_in_the_next(
    redis_url, redis_client, site
):
    first = await crawl(redis_url, site, spider_cls=EveryRunSpider, settings=PERSIST)
    assert first.spider.pages == ["1", "2", "3", "4", "5"]
    redis_client.set(f"ha:{{{NAME}}}:cp:catalogue", json.dumps(left_by_the_version_before(site)))
    resumed = await crawl(redis_url, site, spider_cls=EveryRunSpider, settings=PERSIST)
    assert resumed.spider.pages == ["2", "3", "4", "5"]  # before: ["2"]
    assert sorted(resumed.spider.ids) == list(range(11, 51))
    assert saved(redis_client)["done"] is True  # before: page 3 next
    after = await crawl(redis_url, site, spider_cls=EveryRunSpider, settings=PERSIST)
    assert after.spider.pages == []  # before: ["3"], then ["4"] the run after...
