"""A page's duplicate link stored in another shard than the page counts as filtered, as in
an unsharded crawl, not as a start request's duplicate: the fence of its page is checked
in the page's shard, and the link went on without a parent (a QA run of a sharded crawl:
2,375 start_duplicates where at most 9 start requests could be). Real redis-server."""

from __future__ import annotations

import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.keys import shard_of
from tests.test_shards import LEASE_MS, entry, fp, sharded


async def _counted(redis_url: str, name: str) -> int:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        return sum([int(await client.hget(f"ha:{{s:{i}}}:stats", name) or 0) for i in range(4)])
    finally:
        await client.aclose()


@deferred_f_from_coro_f
async def test_a_duplicate_link_in_another_shard_than_its_page_counts_as_filtered(redis_url):
    q = sharded(redis_url)
    await q.sync(enqueue=[entry("page"), entry("root")])
    page, _ = (await q.sync(lease=2, lease_ms=LEASE_MS)).leases
    home = q.route(page.id)[0]
    link = next(n for n in (f"c{i}" for i in range(100)) if shard_of(fp(n), 4) != home)
    assert (await q.sync(enqueue=[entry(link, (page.id, page.token))])).added == 1
    again = await q.sync(enqueue=[entry(link, (page.id, page.token))])  # the page's link again
    assert (again.added, again.roots_seen) == (0, 0)
    assert (await q.sync(enqueue=[entry("root")])).roots_seen == 1  # a start request again
    assert await _counted(redis_url, "filtered") == 1
    assert await _counted(redis_url, "start_duplicates") == 1
    await q.client.aclose()
