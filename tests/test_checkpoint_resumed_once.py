"""A page a checkpoint resumed its task at is said resumed once ("Resumed task",
``ha/checkpoint/resumed``): its retry (the callback failed: a parse error, its meta stored
with it) is not said resumed again (a review: the mark stayed in the page's meta), and
neither its next pages nor the checkpoints saved carry the mark."""

from __future__ import annotations

import contextlib
import logging

from scrapy import Request, Spider
from scrapy.http import HtmlResponse
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha import metakeys
from scrapy_ha.codec import decode_request, encode_request
from scrapy_ha.config.middlewares import CheckpointConfig
from scrapy_ha.middlewares.checkpoint import RESUMED, CheckpointMiddleware


class Paged(Spider):
    name = "paged"

    def parse(self, response):
        yield {"id": 1}
        yield response.follow("/list/5", self.parse)


async def _drain(mw, response, output):
    out = []
    async for x in mw.process_spider_output(response, output):
        out.append(x)
    return out


async def _gen(items):
    for x in items:
        yield x


@deferred_f_from_coro_f
async def test_a_resumed_page_processed_again_is_said_resumed_again(caplog):
    crawler = get_crawler(Paged, {"HA_CHECKPOINTS": True})
    crawler.spider = crawler._create_spider()
    mw = CheckpointMiddleware(crawler, CheckpointConfig.from_settings(crawler.settings))
    saved = []
    mw._save_at_finish = lambda page, task, doc: saved.append(doc)
    first = encode_request(Request("http://a.test/list/4"), crawler.spider).decode()
    doc = {"task": "t", "page": 4, "items": 30, "done": False, "fields": {}, "next": first}
    page = mw._resumed("t", doc)
    page.meta[metakeys.TASK_STATE][RESUMED] = True  # as _resume does
    with caplog.at_level(logging.INFO, logger="scrapy_ha.middlewares.checkpoint"):
        # first processing: the callback fails after its items (a parse error: retried)
        resp = HtmlResponse(page.url, body=b"<html></html>", request=page)
        with contextlib.suppress(RuntimeError):
            await _drain(mw, resp, _failing())
        # the retry copy, as Redis stores it (its meta encoded with it)
        stored = decode_request(encode_request(page, crawler.spider), crawler.spider)
        resp2 = HtmlResponse(stored.url, body=b"<html></html>", request=stored)
        out = await _drain(mw, resp2, _gen(list(crawler.spider.parse(resp2))))
    nxt = [x for x in out if isinstance(x, Request)]
    said = [r.getMessage() for r in caplog.records if "Resumed task" in r.getMessage()]
    assert all(RESUMED not in x.meta[metakeys.TASK_STATE] for x in nxt)  # next pages: clean
    assert all(RESUMED not in d for d in saved)  # saved checkpoints: clean
    assert crawler.stats.get_value("ha/checkpoint/resumed") == 1, said
    assert said == ["Resumed task t at page 4 (30 items done)"]


async def _failing():
    yield {"id": 1}
    raise RuntimeError("parse error")
