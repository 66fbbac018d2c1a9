"""``scrapy-ha flush`` deletes every key of the crawl, a back queue whose name is not UTF-8
included (written by hand, or by another program under the crawl's prefix): taken as bytes,
never decoded. The console script, a real redis-server."""

from __future__ import annotations

import redis
from scrapy.utils.defer import deferred_f_from_coro_f

from tests.test_cli import scrapy_ha
from tests.test_metrics import live_crawl


@deferred_f_from_coro_f
async def test_flush_deletes_a_back_queue_whose_name_is_not_utf8(redis_url):
    await live_crawl(redis_url)
    client = redis.Redis.from_url(redis_url)
    client.rpush(b"ha:{live}:q:caf\xe9", b"x")  # found by SCAN alone
    client.zadd("ha:{live}:ready", {b"0:\xff": 1})  # named by the ready set
    client.rpush(b"ha:{live}:q:0:\xff", b"y")
    assert client.keys("ha:{live}:*")
    done = scrapy_ha("--redis-url", redis_url, "flush", "live", "-y", "--force")
    assert done.returncode == 0, done.stderr
    assert client.keys("ha:{live}:*") == []
    client.close()


@deferred_f_from_coro_f
async def test_flush_deletes_the_lease_grants_of_workers_gone(redis_url):
    """A QA run: a killed worker's grant (``ha:{S}:grant:<worker>``, which expires on its
    own) outlived the flush, and the dashboard listed the crawl it said did not exist. A
    checkpoint is kept, as ever."""
    await live_crawl(redis_url)
    client = redis.Redis.from_url(redis_url)
    client.set("ha:{live}:grant:vm:32521:dc2985", "x", ex=60)
    client.set("ha:{live}:cp:task1", "{}")
    client.set("ha:{lively}:grant:w", "x", ex=60)  # another crawl's: kept
    done = scrapy_ha("--redis-url", redis_url, "flush", "live", "-y", "--force")
    assert done.returncode == 0, done.stderr
    assert client.keys("ha:{live}:*") == [b"ha:{live}:cp:task1"]
    assert client.exists("ha:{lively}:grant:w")
    client.close()
