"""The pace of a run begun less than a minute ago counts that run's acks alone. A review:
a persisted crawl started again within the minute its previous run acked in read the
previous run's acks of that minute as the new run's (30 pages/s in `status`' ETA and the
dashboard's pages_per_s for 10): the per-minute buckets cannot tell runs apart, so a run
records the crawl's acks when it began (``acked0`` in ``ha:{S}:run``)."""

from __future__ import annotations

import hashlib
import itertools

import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.dashboard._chart import speed
from scrapy_ha.keys import shard_of
from scrapy_ha.ops.stats import CrawlStats, read_crawl_stats_async
from scrapy_ha.ops.waiting import Waiting, acks_since, eta
from scrapy_ha.store.runs import Run, end_run, open_run, read_run
from scrapy_ha.store.sharding import check_shard_count, make_queue, shards_of
from scrapy_ha.store.wire import NewEntry

HEARTBEAT_MS = 30_000
M = 29_000_000  # a minute (ms // 60_000)


def test_a_young_run_s_pace_leaves_out_the_run_before_s_acks_of_its_minute():
    """Run 1 acked 200 in the first 30 s of minute M; run 2 began at 40 s and acked 100 by
    50 s: its pace is 100 over 10 s, 10 pages/s (the bucket, 300 over 10 s, read 30)."""
    begun = M * 60_000 + 40_000
    stats = CrawlStats(
        begun + 10_000, 100, 0, 0, 0, 1, 0, spider="s",
        counters={"acked": 300}, minutes={"acked": {M: 300}},
    )  # fmt: skip
    assert speed(stats, begun) == 30.0  # what it read: without the run's record
    assert speed(stats, begun, acked_before=200) == 10.0
    assert round(eta(stats, Waiting(), begun_ms=begun, acked_before=200).seconds or 0) == 10
    assert round(eta(stats, Waiting(), begun_ms=begun).seconds or 0) == 3
    # a count that went back (the stats were reset by hand): the buckets, as without it
    assert acks_since(stats, M, begun, acked_before=400) == 300


def _entries(shard: int, shards: int, n: int, start: int = 0) -> list[NewEntry]:
    found = []
    for i in itertools.count(start):
        fp = hashlib.sha1(b"%d" % i).digest()[:12]  # noqa: S324 (a test's fingerprints)
        if shard_of(fp, shards) == shard:
            found.append(NewEntry(fp, 0, b'{"v":1,"u":"http://a.test/%d"}' % i))
            if len(found) == n:
                return found
    raise AssertionError


async def _crawl(q, entries: list[NewEntry]) -> None:
    """Enqueue *entries*, lease them and ack them (a run's work)."""
    await q.sync(enqueue=entries)
    got = await q.sync(lease=len(entries), lease_ms=60_000, worker="w")
    assert len(got.leases) == len(entries)
    assert (await q.sync(ack=[(x.id, x.token) for x in got.leases])).acked == len(entries)


@deferred_f_from_coro_f
async def test_a_run_records_the_crawl_s_acks_when_it_began(redis_url):
    for shards in (1, 2):
        client = redis.asyncio.Redis.from_url(redis_url)
        await client.flushdb()
        q = make_queue(client, "ha", "pace", shards, worker="w")
        await check_shard_count(q)  # (the first writer's: readers sum the shards then)
        keys = q.keys
        assert await open_run(q, "w", HEARTBEAT_MS) == Run(1, True)
        first = [e for s in range(shards) for e in _entries(s, shards, 3 + 2 * s)]
        await _crawl(q, first)
        assert await end_run(q)
        assert await open_run(q, "w", HEARTBEAT_MS) == Run(2, True)
        run = await read_run(client, keys)
        assert run is not None and run.acked_before == len(first), (shards, run)
        await _crawl(q, _entries(0, shards, 4, start=10_000))
        stats = await read_crawl_stats_async(client, keys)
        minute = min(stats.minutes["acked"])
        assert acks_since(stats, minute, run.started, run.acked_before) == 4
        # written by hand: the run reads as not having recorded it
        await client.hset(keys.run, "acked0", "garbage")
        assert (await read_run(client, keys)).acked_before is None
        # a run opened by a worker of a version before acked0 (its run.lua writes n, open
        # and started only): the run before's value is not read as its own (a review)
        await client.hset(keys.run, "acked0", f"2:{len(first)}")
        assert (await read_run(client, keys)).acked_before == len(first)
        await client.hset(keys.run, mapping={"n": 3, "open": 1, "started": run.started + 1})
        assert (await read_run(client, keys)).acked_before is None
        assert len(shards_of(q)) == shards
        await client.aclose()


def test_a_run_opened_by_an_earlier_version_has_no_pace_in_the_run_before_s_minute():
    """A rolling upgrade (a QA run): a run opened by a worker of a version before acked0
    records none (the run before's stays, read as not recorded), and its pace counted the
    run before's acks in the bucket of the minute it began: 132 pages/s read for 16, an ETA
    of 1.7 s for 14. The pace counts from the next minute: none (no ETA) until then."""
    from scrapy_ha.cli.status import _eta
    from scrapy_ha.store.runs import RunState

    begun = M * 60_000 + 40_000
    run = RunState(2, True, begun, M * 60_000 + 39_000, acked_before=None)
    assert run.pace_from == (M + 1) * 60_000  # before: begun
    stats = CrawlStats(
        begun + 5_000, 100, 0, 0, 0, 1, 0, spider="s",
        counters={"acked": 380}, minutes={"acked": {M: 380}},
    )  # fmt: skip
    assert speed(stats, run.pace_from) == 0.0  # before: 36 pages/s (80 of its own in 5 s)
    assert eta(stats, Waiting(), begun_ms=run.pace_from).seconds is None
    said = _eta(stats, Waiting(), run)  # (not "nothing acked in the last 5 minutes")
    assert said.startswith("unknown: 100 left, the run's pace counted from its next minute")
    later = CrawlStats(
        (M + 1) * 60_000 + 10_000, 100, 0, 0, 0, 1, 0, spider="s",
        counters={"acked": 600}, minutes={"acked": {M: 500, M + 1: 100}},
    )  # fmt: skip
    assert speed(later, run.pace_from) == 10.0  # its own acks of the minute after
    assert round(eta(later, Waiting(), begun_ms=run.pace_from).seconds or 0) == 10
    # recorded (a run opened by this version), or the run before ended in another minute,
    # or the crawl's first run: from its start, as before
    assert RunState(2, True, begun, begun - 5_000, acked_before=300).pace_from == begun
    assert RunState(2, True, begun, begun - 60_000, acked_before=None).pace_from == begun
    assert RunState(1, True, begun, None).pace_from == begun
