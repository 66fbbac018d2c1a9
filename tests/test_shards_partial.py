"""A sharded round that fails at a later shard, after earlier shards went through, and is
sent again whole (what a worker does after a Redis error): the acks the earlier shards took
are not sent twice, what they counted is counted once, and the leases they granted, which
the worker never read, are given back. A QA run of a cluster failover saw "N ack(s)
refused: their leases had expired and were reclaimed" for acks that had gone through, and
the unread leases wait out a lease period before another worker reclaimed them.

A real Redis refuses the later shard's call before it runs: an ACL user that may not touch
that shard's keys yet (NOPERM), then may."""

from __future__ import annotations

import hashlib
import itertools

import pytest
import redis
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.keys import Keys, shard_of
from scrapy_ha.store.sharding import make_queue
from scrapy_ha.store.wire import NewEntry

KEYS = Keys("ha", "part", 0, 2)


def _entries(shard: int, n: int) -> list[NewEntry]:
    """*n* new requests whose fingerprints place them in *shard* (of 2)."""
    found = []
    for i in itertools.count():
        fp = hashlib.sha1(b"%d" % i).digest()[:12]  # noqa: S324 (a test's fingerprints)
        if shard_of(fp, 2) == shard:
            found.append(NewEntry(fp, 0, b'{"v":1,"u":"http://a.test/%d"}' % i))
            if len(found) == n:
                return found
    raise AssertionError


@pytest.fixture
def admin(redis_url):
    client = redis.Redis.from_url(redis_url)
    client.delete(*(k for shard in KEYS.every_shard() for k in shard.all()))
    yield client
    client.acl_deluser("part")
    client.close()


def _may(admin: redis.Redis, *patterns: str) -> None:
    admin.acl_setuser(
        "part", enabled=True, passwords=["+pw"], keys=list(patterns), commands=["+@all"],
        reset_keys=True,
    )  # fmt: skip


@deferred_f_from_coro_f
async def test_a_round_sent_again_after_a_later_shard_failed_acks_once_and_gives_back(
    redis_url, admin
):
    _may(admin, "~*")
    url = redis_url.replace("redis://", "redis://part:pw@")
    client = redis.asyncio.Redis.from_url(url)
    q = make_queue(client, "ha", "part", 2, worker="w")
    await q.sync(enqueue=[*_entries(0, 3), *_entries(1, 3)])
    first = await q.sync(lease=4, lease_ms=60_000, worker="w")  # shard 0's 3, then shard 1's 1
    by_shard = {s: [(x.id, x.token) for x in first.leases if q.route(x.id)[0] == s] for s in (0, 1)}
    assert len(by_shard[0]) == 3 and len(by_shard[1]) == 1
    # the next round starts at shard 1 (rotation); shard 0's keys are refused to it for now
    _may(admin, "~ha:{part:1}:*", "~ha:{part}:*", "~ha:{part}:*:*")
    acks = [by_shard[1][0], by_shard[0][0]]
    with pytest.raises(redis.exceptions.NoPermissionError):
        await q.sync(ack=acks, lease=2, lease_ms=60_000, worker="w")
    assert admin.zcard("ha:{part:1}:leased") == 2  # shard 1: acked one, leased two
    _may(admin, "~*")
    # a round that goes through without them first (a worker's acks wait for children)
    between = await q.sync(enqueue=_entries(0, 4)[3:], lease_ms=60_000, worker="w")
    assert between.added == 1 and between.released == 2  # the unread leases, given back
    again = await q.sync(ack=acks, lease=2, lease_ms=60_000, worker="w")
    assert again.stale == 0 and again.acked == 2  # before: stale 1, acked 1
    assert len(again.leases) == 2
    held = {x.id for x in again.leases}
    leased = {
        q.outside(s, i.decode())
        for s in (0, 1)
        for i in admin.zrange(f"ha:{{part:{s}}}:leased", 0, -1)
    }
    # leased in Redis: what the worker holds (first's unacked, again's), nothing unread
    assert leased == {*(p[0] for p in by_shard[0][1:]), *held}
    await client.aclose()
