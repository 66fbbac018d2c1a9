"""The sync script's reply, packed (sync.lua's end, store/wire.py's ``sync_result``): the
fields of its lists in one space-separated element must never be shifted by what a
crawl's keys hold. Before: a gate's domain with a space (a host Scrapy made of a no-break
space), a gate's time with a trailing blank, or a back-queue element whose id is not a
number made the worker's parse fail after the script had leased, every round."""

from __future__ import annotations

import pytest
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry

KEYS = Keys("ha", "reply")


def page(host: str, n: int) -> NewEntry:
    payload = b'{"v":1,"u":"http://%s/%d"}' % (host.encode(), n)
    return NewEntry(b"%s/%d" % (host.encode(), n), 0, payload, host=host)


@pytest.mark.parametrize(("domain", "blank"), [("odd host.test", ""), ("ok.test", " "), ("", "")])
@deferred_f_from_coro_f
async def test_gates_of_any_text_leave_the_leases_whole(redis_url, redis_client, domain, blank):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        await q.enqueue([page("free.test", n) for n in range(3)])
        open_at = int(redis_client.time()[0]) * 1000 + 600_000
        redis_client.hset(KEYS.gates, domain, f"{open_at}{blank}")
        redis_client.zadd(KEYS.gate_log, {"=": 1, domain: 1})  # as gate.lua logs a change
        result = await q.sync(lease=3)
        assert result.gates == {domain: open_at}
        assert len(result.leases) == 3
        assert {lease.payload for lease in result.leases} == {
            b'{"v":1,"u":"http://free.test/%d"}' % n for n in range(3)
        }
    finally:
        await q.client.aclose()


@pytest.mark.parametrize("element_id", ["abc", "0x10", "inf"])
@deferred_f_from_coro_f
async def test_an_element_id_that_is_not_a_number_leaves_the_reply_whole(
    redis_url, redis_client, element_id
):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        await q.enqueue([page("free.test", 1)])
        redis_client.lpush(
            KEYS.queue("0:free.test"), element_id + ' {"v":1,"u":"http://free.test/x"}'
        )
        result = await q.sync(lease=3)
        # set aside as corrupt (lib/frontier's element_head), the good one leased
        assert [lease.id for lease in result.leases] == ["1"]
        assert result.set_aside == 1
    finally:
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_the_numbers_come_whole_in_their_one_element(redis_url, redis_client):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    try:
        seconds, micros = redis_client.time()
        empty = await q.sync(lease=1)
        assert empty.head is None and empty.pending == 0 and empty.leases == []
        assert 0 <= empty.now_ms - (seconds * 1000 + micros // 1000) < 60_000  # 13 digits, exact
        await q.enqueue([page("a.test", n) for n in range(3)])
        result = await q.sync(lease=1)
        assert (result.pending, result.leased, len(result.leases)) == (2, 1, 1)
        assert result.head is not None and result.head > result.leases[0].place
    finally:
        await q.client.aclose()
