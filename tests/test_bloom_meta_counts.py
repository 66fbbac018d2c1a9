"""A Bloom filter's meta hash (``ha:{S}:bloom``) whose counts no script wrote (a hand edit:
``n:0`` set to ``x``, ``layers`` deleted) refuses the call that enqueues before any bit is
set, naming the field, and the same call made again once the hash is restored stores every
URL. Before, the bits were set, then the count's ``HINCRBY`` failed: the next call found
the URLs seen and dropped them (a crawl of 200 pages finished after one, its start URL
lost); a layer count read as 0 made the first layer again, zeroed (every URL seen before
crawled again). A real redis-server."""

from __future__ import annotations

import pytest
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.store.aged import AgedBloom
from tests.test_bloom import KEYS, add, bloom_queue, entries

#: (field, what a hand edit leaves there: None deletes it)
FOR_EVER = [
    ("n:0", "x"),
    ("n", "12abc"),
    ("fp", "x"),
    ("layers", "x"),
    ("layers", None),
    ("k", "99"),
    ("capacity", "0"),
]
#: a time slice's counts: slot 0, its first layer (a fresh filter's first slot)
SLICED = [("n0:0", "x"), ("n", "x"), ("fp", "nan"), ("l0", "x"), ("k", "99")]


async def _spoil(client: redis.asyncio.Redis, field: str, value: str | None) -> bytes:
    good = await client.hget(KEYS.bloom, field)
    assert good is not None, field
    if value is None:
        await client.hdel(KEYS.bloom, field)
    else:
        await client.hset(KEYS.bloom, field, value)
    return good


async def _refused_then_whole(queue, field: str, value: str | None) -> None:
    try:
        assert await add(queue, entries(range(10))) == 10
        good = await _spoil(queue.client, field, value)
        with pytest.raises(redis.exceptions.ResponseError) as refused:
            await queue.enqueue(entries(range(10, 20)))
        await queue.client.hset(KEYS.bloom, field, good)  # the operator restores it
        assert await add(queue, entries(range(10, 20))) == 10  # none taken for seen: none lost
        assert await add(queue, entries(range(20))) == 0  # and what was seen is seen still
        assert f"unreadable Bloom filter meta {KEYS.bloom}: {field} " in str(refused.value)
    finally:
        await queue.client.flushdb()
        await queue.client.aclose()


@pytest.mark.parametrize(("field", "value"), FOR_EVER)
@deferred_f_from_coro_f
async def test_a_count_no_script_wrote_refuses_the_call_before_any_bit_is_set(
    redis_url, field, value
):
    await _refused_then_whole(bloom_queue(redis_url, capacity=1000), field, value)


@pytest.mark.parametrize(("field", "value"), SLICED)
@deferred_f_from_coro_f
async def test_a_time_slice_s_count_no_script_wrote_refuses_the_call_too(redis_url, field, value):
    queue = bloom_queue(redis_url, capacity=1000)
    queue.dupefilter = AgedBloom(1000, 1e-3, 3_600_000)
    await _refused_then_whole(queue, field, value)
