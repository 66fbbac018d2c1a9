"""A dashboard action on a crawl with a key of another type than scrapy-ha writes is
refused (409, naming the key) before it changes anything, even when that key is in the
last shard it would reach. A real redis-server, a sharded crawl, the dashboard's API."""

from __future__ import annotations

import asyncio

import redis
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.store.sharding import check_shard_count
from tests.test_dashboard_api import dashboard
from tests.test_shards import entry, lease_all, sharded


@deferred_f_from_coro_f
async def test_an_action_refused_for_a_key_of_another_type_has_done_nothing(redis_url):
    q = sharded(redis_url, shards=2)
    await check_shard_count(q)  # the crawl's layout in Redis: two shards
    await q.sync(enqueue=[entry(f"u{i}") for i in range(8)])
    for x in await lease_all(q):
        assert await q.dead_letter(x.id, x.token, {"class": "gone", "reason": "404"})
    await q.client.aclose()
    client = redis.Redis.from_url(redis_url)
    first = client.zrange("ha:{s:0}:dead", 0, 0)[0].decode()  # an entry of shard 0
    client.delete("ha:{s:1}:dead")
    client.set("ha:{s:1}:dead", "x")
    before = client.zcard("ha:{s:0}:dead")

    def act() -> None:
        with dashboard(redis_url) as http:
            done = http.post("/api/crawls/s/actions/purge", json={"ids": [first, "1:5"]})
            assert done.status_code == 409, done.text
            assert "ha:{s:1}:dead holds a string" in done.json()["error"]
            # its dry run too, which looks the ids up in that key
            body = {"ids": [first, "1:5"], "dry_run": True}
            dry = http.post("/api/crawls/s/actions/purge", json=body)
            assert dry.status_code == 409, dry.text
            assert "ha:{s:1}:dead holds a string" in dry.json()["error"]

    await asyncio.to_thread(act)
    assert client.zcard("ha:{s:0}:dead") == before  # entry `first` not purged
    assert client.zscore("ha:{s:0}:dead", first) is not None
    client.close()
