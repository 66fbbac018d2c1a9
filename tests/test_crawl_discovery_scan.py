"""Finding the crawls under a prefix (the dashboard's overview, the metrics exporter) scans
the key space; a crawl of many hosts has a back queue key per host (``q:<qid>``) and a
checkpoint key per task (``cp:<task>``). Every such name was sent back by the SCAN and
read here: a QA run's overview took 0.8 to 1.0 s at 50,000 keys, 0.03 s at 1,000, and
would outgrow its 5 s refresh at a million hosts. Redis now matches the names that say a
crawl is there while it scans."""

from __future__ import annotations

import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.dashboard._data import crawl_names
from scrapy_ha.ops.crawls import KeyNames, discover

#: Back queues and checkpoints of the crawl of many hosts.
MANY = 5_000


class CountedNames(KeyNames):
    """KeyNames that counts the names the SCAN sent back."""

    def __init__(self, prefix: str) -> None:
        super().__init__(prefix)
        self.read = 0

    def text(self, raw):
        self.read += 1
        return super().text(raw)


def seed(client) -> None:
    client.hset("ha:{counted}:stats", "acked", 1)
    client.zadd("ha:{dead_only}:dead", {"1": 1})
    client.set("ha:{paused_only}:paused", 1)
    client.xadd("ha:{items_only}:items", {"e": "1"})
    client.zadd("ha:{hosts}:ready", {"q1": 1})
    pipe = client.pipeline(transaction=False)
    for i in range(MANY):
        pipe.rpush(f"ha:{{hosts}}:q:{i}", b"x")
        pipe.set(f"ha:{{hosts}}:cp:task-{i}", b"{}")
    pipe.set("other:{x}:stats", 1)  # another prefix
    pipe.execute()


@deferred_f_from_coro_f
async def test_the_scan_that_finds_crawls_is_not_sent_every_host_queue(redis_url, redis_client):
    seed(redis_client)
    expected = ["counted", "dead_only", "hosts", "items_only", "paused_only"]
    names = CountedNames("ha")
    assert discover(redis_client, "ha", names) == ["counted", "dead_only", "hosts"]
    assert names.read < 20, names.read  # before: every one of the 10,000 keys
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        names = CountedNames("ha")
        assert await crawl_names(client, "ha", names) == expected
        assert names.read < 20, names.read
    finally:
        await client.aclose()
