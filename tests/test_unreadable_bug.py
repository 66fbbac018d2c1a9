"""An error no reader of a crawl foresaw (a bug in scrapy-ha, not a key of the wrong type)
costs that crawl alone and is logged at ERROR with its traceback, once per crawl and error
type, not at every scrape. The bug is put in by hand (there is none known to trigger); the
rest is real: a redis-server, the exporter's collector."""

from __future__ import annotations

import logging

import redis
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.ops import crawls, revisits
from scrapy_ha.ops.metrics import CrawlCollector
from tests.test_metrics import live_crawl
from tests.test_unreadable_names import _samples


def _buggy(original, spider: str, error: Exception):
    """*original*, that raises *error* for crawl *spider* alone."""

    def read(*args, **kwargs):
        if any(spider in str(a) for a in args):
            raise error
        return original(*args, **kwargs)

    return read


@deferred_f_from_coro_f
async def test_a_reader_bug_is_logged_with_its_traceback_once_and_costs_its_crawl_alone(
    redis_url, caplog, monkeypatch
):
    await live_crawl(redis_url)
    client = redis.Redis.from_url(redis_url)
    client.hset("ha:{bug1}:stats", "acked", 1)
    client.hset("ha:{bug2}:stats", mapping={"acked": 1, "revisit/scheduled": 1})
    bug1, bug2 = RuntimeError("no such attribute"), KeyError("n:0")
    monkeypatch.setattr(crawls, "_numbers", _buggy(crawls._numbers, "bug1", bug1))
    monkeypatch.setattr(
        revisits, "read_revisits_sync", _buggy(revisits.read_revisits_sync, "bug2", bug2)
    )
    collector = CrawlCollector(client, "ha", discovery_ttl=0)
    with caplog.at_level(logging.DEBUG, logger="scrapy_ha"):
        scrapes = [_samples(collector) for _ in range(3)]
    for samples in scrapes:
        assert samples[("scrapy_ha_requests", ("live", "pending"))] == 2
        assert samples[("scrapy_ha_crawl_read_error", ("live",))] == 0
        assert samples[("scrapy_ha_crawl_read_error", ("bug1",))] == 1
        assert samples[("scrapy_ha_crawl_read_error", ("bug2",))] == 1
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [(r.getMessage().split(":")[0], r.exc_info[1]) for r in errors] == [
        ("unexpected error reading the crawl bug1", bug1),
        ("unexpected error reading the crawl bug2", bug2),
    ]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("bug1: unexpected RuntimeError: no such attribute (a bug" in w for w in warned)
    client.close()
