"""Retention and purge keep the dead letters not archived yet, once an archive is declared:
the scripts (dead, reclaim, purge) against a real redis-server."""

from __future__ import annotations

import asyncio

import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.deadletters.dlq import DeadEntry
from scrapy_ha.deadletters.marks import ARCHIVE_MARK, holds, mark
from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry

KEYS = Keys("ha", "s")
WHY = {"class": "gone", "reason": "HTTP 404"}


async def dead_letters(q: RedisQueue, names: list[str], **retention: int) -> list[str]:
    await q.enqueue([NewEntry(n.encode(), 0, f"payload-{n}".encode()) for n in names])
    leases = await q.lease(len(names), 30000)
    for lease in leases:  # returns the queue's size: 0 once retention keeps none
        await q.dead_letter(lease.id, lease.token, WHY, **retention)
    assert await q.client.zcard(KEYS.leased) == 0
    return [lease.id for lease in leases]


async def archive(q: RedisQueue, ids: list[str]) -> None:
    """What `dlq archive` records once the rows are written: each entry's dead-letter time."""
    for entry_id in ids:
        score = await q.client.zscore(KEYS.dead, entry_id)
        await q.client.hset(KEYS.dead_archived, entry_id, int(score))


async def dead(q: RedisQueue) -> set[str]:
    return {x.decode() for x in await q.client.zrange(KEYS.dead, 0, -1)}


@deferred_f_from_coro_f
async def test_retention_and_purge_drop_only_archived_entries(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    a, b, c = await dead_letters(q, ["a", "b", "c"])
    await q.client.hset(KEYS.dead_archived, ARCHIVE_MARK, "sqlite:///x.db")
    await archive(q, [a])

    # the dead script's retention (keep none): only the archived entry goes
    (d,) = await dead_letters(q, ["d"], max_entries=0)
    assert await dead(q) == {b, c, d}
    assert await q.client.hget(KEYS.dead_archived, a) is None  # its mark went with it

    # the reclaim script's retention (a poison entry): the same rule
    await archive(q, [b])
    await q.enqueue([NewEntry(b"e", 0, b"payload-e")])
    (lease,) = await q.lease(1, 10)
    pair = (lease.id, lease.token)  # handed to the engine: its expiry counts toward poison
    await q.renew([pair], handed=[pair], worker="w", lease_ms=10, heartbeat_ms=1000)
    await asyncio.sleep(0.05)
    reclaimed = await q.reclaim(
        worker="w", interval_ms=1000, batch=10, max_expiries=1, max_entries=0
    )
    assert reclaimed is not None and reclaimed[1] == [lease.id]
    assert await dead(q) == {c, d, lease.id}

    # purge: archived entries go, the others are kept and counted
    await archive(q, [c])
    assert await q.purge_dead([c, d, lease.id, "no-such-id"]) == (1, 2)
    assert await dead(q) == {d, lease.id}

    # an entry dead-lettered again after it was archived is a new version: not archived
    await q.client.hset(KEYS.dead_archived, d, 1)  # an older dead-letter time
    assert await q.purge_dead([d]) == (0, 1)

    # no archive declared: retention drops as before
    await q.client.hdel(KEYS.dead_archived, ARCHIVE_MARK)
    await dead_letters(q, ["f"], max_entries=0)
    assert await dead(q) == set()
    await q.client.aclose()


async def versions(q: RedisQueue, ids: list[str]) -> list[DeadEntry]:
    """The entries as an archiver reads them (their current dead-letter times)."""
    return [entry(i, int(await q.client.zscore(KEYS.dead, i))) for i in ids]


def entry(entry_id: str, dead_at: int) -> DeadEntry:
    return DeadEntry(entry_id, f"http://x/{entry_id}", "gone", "HTTP 404", dead_at)


@deferred_f_from_coro_f
async def test_each_archive_is_marked_on_its_own_and_any_of_them_lets_an_entry_go(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    a, b = await dead_letters(q, ["a", "b"])
    await q.client.hset(KEYS.dead_archived, ARCHIVE_MARK, "sqlite:///x.db")
    first, second = await versions(q, [a]), await versions(q, [a, b])
    await mark(q.client, KEYS, "aaaa0001", first)
    await mark(q.client, KEYS, "bbbb0002", second)
    await mark(q.client, KEYS, "aaaa0001", first)  # marked twice: named once
    at_a = first[0].dead_at
    assert (await q.client.hget(KEYS.dead_archived, a)).decode() == f"{at_a} aaaa0001 bbbb0002"
    marks = await q.client.hmget(KEYS.dead_archived, [a, b])
    assert [holds(m, "aaaa0001", e.dead_at) for m, e in zip(marks, second, strict=True)] == [
        True,
        False,
    ]
    assert [holds(m, "bbbb0002", e.dead_at) for m, e in zip(marks, second, strict=True)] == [
        True,
        True,
    ]
    assert not holds(str(at_a).encode(), "aaaa0001", at_a)  # a bare time names no archive

    # a newer version replaces the mark; a copier late with the older one changes nothing
    newer = entry(a, at_a + 5)
    await q.client.zadd(KEYS.dead, {a: newer.dead_at})
    assert await q.purge_dead([a]) == (0, 1)  # no archive holds this version yet
    await mark(q.client, KEYS, "bbbb0002", [newer])
    await mark(q.client, KEYS, "aaaa0001", first)
    assert (await q.client.hget(KEYS.dead_archived, a)).decode() == f"{at_a + 5} bbbb0002"
    # retention and purge drop what one archive holds
    assert await q.purge_dead([a, b]) == (2, 0)
    await q.client.aclose()
