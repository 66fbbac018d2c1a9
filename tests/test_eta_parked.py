"""The ETA of ``scrapy-ha status`` and the dashboard counts the pending requests parked in
a back queue behind a closed gate (or a domain's limits) from their queue's time, as it
counts delayed work from its due time. A QA run: after ``delayed retry-now`` made a 429's
retry due, the 20 requests of its domain all waited behind its gate for 10 more minutes,
and ``status`` read "eta 8s" (``eta 40s`` below, before). Real redis-server."""

from __future__ import annotations

import json

import redis
import redis.asyncio

from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry
from tests.cli_seed import _run, scrapy_ha

KEYS = Keys("ha", "etagate")
GATE_MS = 600_000


async def _parked_behind_a_gate(url: str) -> None:
    queue = RedisQueue(redis.asyncio.Redis.from_url(url), KEYS)
    entries = [
        NewEntry(b"fp%d" % i, 0, b'{"v":1,"u":"http://held.test/%d"}' % i, host="held.test")
        for i in range(20)
    ]
    assert await queue.enqueue(entries) == 20
    await queue.close_gate("held.test", GATE_MS)
    assert await queue.lease(5, 60_000) == []  # the host's queue is parked behind it
    await queue.client.aclose()


def test_the_eta_counts_requests_parked_behind_a_gate_from_when_it_opens(redis_url):
    _run(_parked_behind_a_gate(redis_url))
    client = redis.Redis.from_url(redis_url)
    assert client.zcard(KEYS.waiting) == 1
    client.hset(KEYS.stats_minutes, f"acked:{client.time()[0] // 60}", 30)  # a pace
    client.close()
    done = scrapy_ha("status", "etagate", "--json", "--redis-url", redis_url)
    doc = json.loads(done.stdout)
    assert doc["pending"] == 20 and doc["waiting"]["gate"] == {"held.test": 20}
    assert doc["eta_seconds"] is not None
    assert doc["eta_seconds"] >= GATE_MS / 1000 - 30, doc["eta_seconds"]  # not "40.0"
    text = scrapy_ha("status", "etagate", "--redis-url", redis_url).stdout
    eta = next(line for line in text.splitlines() if line.strip().startswith("eta "))
    assert "eta  1" in eta and "m " in eta, eta  # 10m 40s or so
