"""A back-queue element as enqueued (no place written) whose id is not a whole number is
set aside as corrupt, like one without an id. Before: its id text became its score, and
the lease's ZADD of it back to the ready set failed half-way through the call, after the
queue was trimmed: the requests taken in that call were gone, with no dead letter."""

from __future__ import annotations

import pytest
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue

KEYS = Keys("ha", "garbage")


@pytest.mark.parametrize("garbage", ["abc", "nan", "0x1", "1e5"])
@deferred_f_from_coro_f
async def test_an_element_id_that_is_not_a_number_is_set_aside(redis_url, redis_client, garbage):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        key = KEYS.queue("0:x")
        redis_client.rpush(key, *[f'{garbage}{n} {{"v":1,"u":"http://x/{n}"}}' for n in "123"])
        redis_client.rpush(key, '7 {"v":1,"u":"http://x/7"}')  # a good one behind them
        redis_client.zadd(KEYS.ready, {"0:x": 0})
        result = await q.sync(lease=2)
        assert [lease.id for lease in result.leases] == ["7"]
        assert result.set_aside == 3
        assert redis_client.zcard(KEYS.dead) == 3
        assert redis_client.llen(key) == 0
    finally:
        await q.client.aclose()
