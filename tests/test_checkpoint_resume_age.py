"""A task resumed from its checkpoint is filtered as its root is, and by the root's age too:
a root with ``meta["ha_recrawl_after"]`` is new again after that age, and so is its resumed
page (before, the resumed page had none, so with ``HA_DUPEFILTER_TTL`` of a day the task
stayed filtered a day where its root was new after an hour; a review). Real redis-server,
the real scheduler and middleware."""

from __future__ import annotations

import json

from scrapy import Request, Spider
from scrapy.utils.defer import deferred_f_from_coro_f, maybe_deferred_to_future
from scrapy.utils.test import get_crawler

from scrapy_ha import metakeys
from scrapy_ha.codec import encode_request
from scrapy_ha.middlewares.checkpoint import CheckpointMiddleware
from scrapy_ha.scheduler.shell import Scheduler


@deferred_f_from_coro_f
async def test_a_resumed_task_keeps_its_roots_recrawl_age(redis_url, redis_client):
    settings = {
        "SCHEDULER": "scrapy_ha.Scheduler",
        "REDIS_URL": redis_url,
        "HA_CHECKPOINTS": True,
        "HA_DUPEFILTER_TTL": 86400,
    }
    crawler = get_crawler(Spider, settings)
    scheduler = Scheduler.from_crawler(crawler)
    spider = Spider.from_crawler(crawler, name="aged")
    crawler.spider = spider
    await maybe_deferred_to_future(scheduler.open(spider))
    try:
        nxt = encode_request(Request("http://a.test/list/5"), spider).decode()
        doc = {"task": "t", "of": 4, "page": 5, "items": 20, "done": False, "next": nxt}
        redis_client.set("ha:{aged}:cp:t", json.dumps(doc))
        middleware = CheckpointMiddleware.from_crawler(crawler)
        root = Request("http://a.test/list/1", meta={"ha_task": "t", "ha_recrawl_after": 3600})
        resumed = await middleware._resume(root)
        assert resumed is not None and resumed.url == "http://a.test/list/5"
        assert resumed.meta.get(metakeys.RECRAWL_AFTER) == 3600
        resumed.meta["is_start_request"] = True
        assert scheduler.enqueue_request(resumed)
        (entry,) = scheduler.outbox.children
        assert entry.age_ms == 3_600_000  # the root's age, as the root's own entry has
        # a root without an age, its next page with one of its own (a review: the page's
        # age was applied to the root's fingerprint)
        aged_next = Request("http://a.test/list/5", meta={"ha_recrawl_after": 60})
        doc["next"] = encode_request(aged_next, spider).decode()
        redis_client.set("ha:{aged}:cp:t", json.dumps(doc))
        plain_root = Request("http://a.test/list/1", meta={"ha_task": "t"})
        resumed = await middleware._resume(plain_root)
        assert resumed is not None and metakeys.RECRAWL_AFTER not in resumed.meta
    finally:
        await maybe_deferred_to_future(scheduler.close("shutdown"))
