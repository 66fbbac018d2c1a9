"""``dlq purge --dry-run`` with an SQL archive declared says what the purge would do: it
keeps the entries no archive holds (``lib/deadletter.lua``'s rule), so the dry run counts
them apart (a QA run: "would purge 5", then "purged 0 of 5"). The rule read in Python
(:func:`kept_by_purge`) agrees with the script's, shard by shard, on a real Redis."""

from __future__ import annotations

import hashlib

import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.deadletters.marks import ARCHIVE_MARK, kept_by_purge
from scrapy_ha.keys import shard_of
from scrapy_ha.ops.shards import dead_letters
from scrapy_ha.store.sharding import make_queue
from scrapy_ha.store.wire import NewEntry


@deferred_f_from_coro_f
async def test_the_dry_run_keeps_what_the_purge_keeps_in_every_shard(redis_url):
    client = redis.asyncio.Redis.from_url(redis_url)
    q = make_queue(client, "ha", "kp", 2, worker="w")
    for shard in q.shards:
        await client.delete(*shard.keys.all())
    entries = [
        NewEntry(fp, 0, b'{"v":1,"u":"http://a.test/%d"}' % i)
        for i in range(8)
        if (fp := hashlib.sha1(b"%d" % i).digest()[:12])  # noqa: S324 (test fingerprints)
    ]
    assert {shard_of(e.fingerprint, 2) for e in entries} == {0, 1}
    await q.sync(enqueue=entries)
    leases = (await q.sync(lease=8, lease_ms=60_000, worker="w")).leases
    for lease in leases:
        assert await q.dead_letter(lease.id, lease.token, {"class": "gone", "reason": "410"})
    dlq = dead_letters(q)
    dead = await dlq.entries()
    assert len(dead) == 8
    # an archive declared in each shard; the first entry of each shard archived, and one
    # more archived at an older version (dead-lettered again since: not archived)
    firsts: dict[int, object] = {}
    for e in dead:
        firsts.setdefault(q.route(e.id)[0], e)
    for shard, part in enumerate(q.shards):
        await client.hset(part.keys.dead_archived, ARCHIVE_MARK, "sqlite:///x.db")
        first = firsts[shard]
        local = q.route(first.id)[1]
        await client.hset(part.keys.dead_archived, local, f"{first.dead_at} s1")
    older = next(e for e in dead if e not in firsts.values())
    shard, local = q.route(older.id)
    await client.hset(q.shards[shard].keys.dead_archived, local, f"{older.dead_at - 1} s1")
    kept = await kept_by_purge(dlq, dead)
    assert {e.id for e in kept} == {e.id for e in dead} - {e.id for e in firsts.values()}
    purged = await dlq.purge([e.id for e in dead])
    assert purged == 2 and dlq.kept_unarchived == len(kept) == 6  # as the script decides
    await client.aclose()
