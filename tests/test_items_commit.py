"""The item outbox in Redis: a page's items (and its task's checkpoint) are committed by the
script call that acks the page, fenced by its lease token; a stale ack commits nothing;
consumers' acknowledgements trim only what every group has acknowledged."""

from __future__ import annotations

import asyncio
import hashlib
import json
from functools import partial

import pytest
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.config.validate import ConfigError
from scrapy_ha.keys import Keys
from scrapy_ha.store.items import ItemStream
from scrapy_ha.store.join import join_crawl
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.script_keys import sync_keys
from scrapy_ha.store.wire import Commit, NewEntry
from tests.test_shards import lease_all, sharded

KEYS = Keys("ha", "s")


def open_queue(url: str) -> RedisQueue:
    return RedisQueue(redis.asyncio.Redis.from_url(url), KEYS)


def items(*ids: int) -> tuple[bytes, ...]:
    return tuple(json.dumps({"id": i}).encode() for i in ids)


async def stream_ids(q: RedisQueue, key: str = KEYS.items) -> list[int]:
    return [json.loads(f[b"i"])["id"] for _, f in await q.client.xrange(key)]


async def expire_and_release(q: RedisQueue) -> None:
    """Let every lease expire and go back to pending (the worker died or froze)."""
    await asyncio.sleep(0.08)
    result = await q.reclaim(worker="other", interval_ms=1, batch=100, max_expiries=10)
    assert result is not None and result.reclaimed > 0


@deferred_f_from_coro_f
async def test_the_ack_of_a_page_commits_its_items_in_the_same_call(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([NewEntry(b"a", 0, b"page-a"), NewEntry(b"b", 0, b"page-b")])
    a, b = await q.lease(2, 30000)
    result = await q.sync(
        ack=[(a.id, a.token), (b.id, b.token)],
        commits={(a.id, a.token): Commit(items(1, 2, 3))},  # b yielded nothing
    )
    assert (result.acked, result.stale, result.items) == (2, 0, 3)
    assert await stream_ids(q) == [1, 2, 3]
    stats = await q.client.hgetall(KEYS.stats)
    assert stats[b"items"] == b"3" and b"items_refused" not in stats
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_stale_ack_commits_nothing_and_the_run_that_acks_counts(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([NewEntry(b"a", 0, b"page-a")])
    (first,) = await q.lease(1, 50)
    await expire_and_release(q)  # the first worker froze: its lease went back
    (second,) = await q.lease(1, 30000)
    assert second.id == first.id and second.token != first.token
    late = await q.sync(
        ack=[(first.id, first.token)], commits={(first.id, first.token): Commit(items(1, 2))}
    )
    assert (late.acked, late.stale, late.items) == (0, 1, 0)
    assert await stream_ids(q) == []
    done = await q.sync(
        ack=[(second.id, second.token)], commits={(second.id, second.token): Commit(items(1, 2))}
    )
    assert (done.acked, done.items) == (1, 2)
    assert await stream_ids(q) == [1, 2]
    stats = await q.client.hgetall(KEYS.stats)
    assert (stats[b"items"], stats[b"items_refused"]) == (b"2", b"2")
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_the_checkpoint_goes_with_the_items_under_the_same_lease(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([NewEntry(b"a", 0, b"page-1"), NewEntry(b"b", 0, b"page-2")])
    one, two = await q.lease(2, 50)
    doc = json.dumps({"task": "t", "of": 1, "page": 2, "items": 2, "done": False}).encode()
    commit = Commit(items(1, 2), ("t", doc, 60_000))
    result = await q.sync(ack=[(one.id, one.token)], commits={(one.id, one.token): commit})
    assert (result.items, result.checkpoints) == (2, 1)
    assert json.loads(await q.client.get(KEYS.checkpoint("t")))["page"] == 2
    # a stale page saves no checkpoint either
    await expire_and_release(q)
    doc2 = json.dumps({"task": "t", "of": 2, "page": 3, "items": 4, "done": False}).encode()
    stale = await q.sync(
        ack=[(two.id, two.token)],
        commits={(two.id, two.token): Commit(items(3, 4), ("t", doc2, 60_000))},
    )
    assert (stale.stale, stale.items, stale.checkpoints) == (1, 0, 0)
    assert json.loads(await q.client.get(KEYS.checkpoint("t")))["page"] == 2
    assert await stream_ids(q) == [1, 2]
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_malformed_commit_is_refused_as_stale_and_applies_nothing(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([NewEntry(b"a", 0, b"page-a")])
    (a,) = await q.lease(1, 30000)
    reply = await q._sync(
        keys=[*(await _sync_keys(q))],
        args=[
            0,
            1,
            0,
            30000,
            0,
            "n0nce",
            "fifo",
            "-",
            0,
            f"{a.id} {a.token} 2 - 3:abc9:short",
            "",
            0,
            "set",
        ],
    )
    assert reply[2:4] == [0, 1]  # acked 0, stale 1
    assert await q.client.xlen(KEYS.items) == 0
    await q.client.aclose()


async def _sync_keys(q: RedisQueue) -> list[str]:
    return sync_keys(q.keys, q.keys.dupefilter)


@deferred_f_from_coro_f
async def test_a_sharded_crawl_commits_a_pages_items_to_its_shards_stream(redis_url):
    q = sharded(redis_url, shards=3)
    names = [f"https://example.com/{i}" for i in range(12)]
    await q.sync(enqueue=[NewEntry(n.encode(), 0, n.encode()) for n in names])
    leases = await lease_all(q)
    commits = {(x.id, x.token): Commit(items(i)) for i, x in enumerate(leases)}
    result = await q.sync(ack=[(x.id, x.token) for x in leases], commits=commits)
    assert (result.acked, result.items) == (12, 12)
    found = []
    for i, shard in enumerate(q.shards):
        ids = await stream_ids(shard, shard.keys.items)
        shard_of_lease = [n for n, x in enumerate(leases) if q.route(x.id)[0] == i]
        assert sorted(ids) == sorted(shard_of_lease)
        found += ids
    assert sorted(found) == list(range(12))
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_an_entry_leaves_the_stream_once_every_group_acknowledged_it(redis_url):
    q = open_queue(redis_url)
    stream = ItemStream(q.client, KEYS)
    await stream.add(list(items(1, 2, 3, 4)))  # items of no page go in as they come
    await stream.join("jsonl")
    await stream.join("sql")
    got = await stream.read("jsonl", "c1", 10)
    assert [d.id for d in got] and len(got) == 4
    assert await stream.ack("jsonl", [d.id for d in got]) == (4, 0)  # sql has read none
    first_two = await stream.read("sql", "c2", 2)
    assert await stream.ack("sql", [first_two[0].id]) == (1, 1)  # both acknowledged entry 1
    assert await q.client.xlen(KEYS.items) == 3
    rest = await stream.read("sql", "c2", 10)
    assert await stream.ack("sql", [first_two[1].id, *(d.id for d in rest)]) == (3, 3)
    assert await q.client.xlen(KEYS.items) == 0
    state = await stream.state()
    assert {g.name: (g.pending, g.consumed) for g in state.groups} == {
        "jsonl": (0, 4),
        "sql": (0, 4),
    }
    stats = await q.client.hgetall(KEYS.stats)
    assert stats[b"items_consumed"] == b"8" and stats[b"items"] == b"4"
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_entries_pending_in_a_group_are_never_trimmed(redis_url):
    q = open_queue(redis_url)
    stream = ItemStream(q.client, KEYS)
    await stream.add(list(items(1, 2, 3)))
    await stream.join("sql")
    got = await stream.read("sql", "dead-consumer", 3)
    # another consumer acknowledges nothing of them: the first one stays pending
    assert await stream.ack("sql", [got[1].id, got[2].id]) == (2, 0)
    assert await q.client.xlen(KEYS.items) == 3
    taken = await stream.claim("sql", "heir", 0, 10)
    assert [d.id for d in taken] == [got[0].id] and taken[0].data == items(1)[0]
    assert await stream.ack("sql", [got[0].id]) == (1, 3)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_finished_crawl_keeping_items_is_not_taken_over_by_another_layout(redis_url):
    """Between one shard and several, a new layout reads other hash tags: a finished crawl
    whose stream still holds items its sinks have not consumed keeps its layout until they
    have (the take-over deletes what the old tags hold)."""
    q = open_queue(redis_url)
    stream = ItemStream(q.client, KEYS)
    await stream.add(list(items(1, 2, 3)))
    await q.finish("w0")
    join = partial(join_crawl, q.client, "ha", "s", shards=3, registration_ms=30_000)
    with pytest.raises(ConfigError, match=r"and 3 item\(s\) its sinks have not all consumed"):
        await join(worker="w1")
    await stream.join("sql")
    got = await stream.read("sql", "c", 10)
    await stream.ack("sql", [d.id for d in got])  # consumed: the stream is empty
    joined = await join(worker="w1")
    assert (joined.shards, joined.replaced) == (3, "1")
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_finished_crawl_keeping_set_aside_items_is_not_taken_over_by_another_layout(
    redis_url,
):
    """The set-aside records are among what a take-over deletes: a finished crawl whose
    only leftover is an item a sink set aside keeps its layout (it was taken over and the
    record deleted)."""
    q = open_queue(redis_url)
    stream = ItemStream(q.client, KEYS)
    await stream.join("sql")
    await stream.add(list(items(1)))
    (got,) = await stream.read("sql", "c", 10)
    assert await stream.set_aside("sql", "c", got.id, "IntegrityError: CHECK") == 1
    await q.finish("w0")
    assert await q.client.xlen(KEYS.items) == 0
    join = partial(join_crawl, q.client, "ha", "s", shards=3, registration_ms=30_000)
    with pytest.raises(ConfigError, match=r"and 1 item\(s\) a sink set aside.*--retry-aside"):
        await join(worker="w1")
    assert await q.client.xlen(KEYS.items_aside) == 1
    await stream.drop_aside((await stream.aside("sql"))[0].record_id)  # written at last
    joined = await join(worker="w1")
    assert (joined.shards, joined.replaced) == (3, "1")
    await q.client.aclose()


@pytest.mark.parametrize("bloom", [False, True], ids=["set", "bloom"])
@pytest.mark.parametrize("worker", [None, "w1"])
@deferred_f_from_coro_f
async def test_a_checkpoint_with_the_ack_is_never_taken_for_the_workers_grant(
    redis_url, worker, bloom
):
    """The checkpoint keys an ack names follow the call's fixed keys, where a worker's
    grant is when the call names a worker: the script tells them apart, whether the call
    names a worker or not, and with the Bloom filter's bitmaps after them."""
    from scrapy_ha.store.bloom import BloomFilter

    q = open_queue(redis_url)
    if bloom:
        q.dupefilter = BloomFilter(1000, 1e-3)
    fp = lambda name: hashlib.sha1(name).digest()  # noqa: E731 (the filter reads bytes 5-16)
    await q.sync(enqueue=[NewEntry(fp(n), 0, b"page-" + n) for n in (b"a", b"b", b"c")])
    (one,) = await q.lease(1, 30000)
    doc = json.dumps({"task": "t", "of": 1, "page": 2, "items": 1, "done": False}).encode()
    result = await q.sync(
        ack=[(one.id, one.token)],
        commits={(one.id, one.token): Commit(items(1), ("t", doc, 60_000))},
        enqueue=[NewEntry(fp(b"d"), 0, b"page-d")],
        lease=2,
        worker=worker,
    )
    assert (result.added, result.acked, result.items, result.checkpoints) == (1, 1, 1, 1)
    assert len(result.leases) == 2
    assert json.loads(await q.client.get(KEYS.checkpoint("t")))["page"] == 2
    assert await q.client.type(KEYS.checkpoint_ahead("t")) in (b"hash", b"none")
    granted = await q.granted("w1")
    assert len(granted) == (2 if worker else 0)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_an_acknowledged_entry_leaves_no_single_write_count_behind(redis_url):
    """A consumer killed after its sink committed a counted single write (its offset file
    acknowledged at the next start), or an entry deleted while pending: the ack deletes the
    entry's count in items_tries, which nothing else would."""
    q = open_queue(redis_url)
    stream = ItemStream(q.client, KEYS)
    await stream.join("j")
    await stream.add(list(items(1, 2)))
    got = await stream.read("j", "c", 10)
    for d in got:
        assert await stream.begin_single("j", d.id) == 1  # then the consumer died
    assert await q.client.hlen(KEYS.items_tries) == 2
    assert await stream.ack("j", [d.id for d in got]) == (2, 2)
    assert await q.client.exists(KEYS.items_tries) == 0
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_consume_reads_every_shard_a_shrunk_crawls_layout_spans(redis_url, tmp_path):
    """A crawl run at 3 shards, then at 2 (layout "2 3": the third shard's items stay in
    the layout): consume() reads the layout as the workers do and gets all three shards'
    items (it parsed the layout as a whole number and crashed)."""
    from scrapy_ha.items import consume
    from scrapy_ha.sinks.jsonl import JsonLinesSink
    from scrapy_ha.store.sharding import make_queue, shards_of

    client = redis.asyncio.Redis.from_url(redis_url)
    for n, shard in enumerate(shards_of(make_queue(client, "ha", "s", 2, span=3))):
        await ItemStream(client, shard.keys).add(list(items(n)))
    await client.set(KEYS.shard_count, "2 3")
    path = tmp_path / "items.jsonl"
    stop = asyncio.Event()
    task = asyncio.ensure_future(
        consume(redis_url, "s", JsonLinesSink(path), group="jsonl", block=0.1, stop=stop)
    )
    while not path.exists() or len(path.read_text().splitlines()) < 3:
        if task.done():
            task.result()  # its error, if it crashed
        await asyncio.sleep(0.02)
    stop.set()
    await task
    assert sorted(json.loads(line)["id"] for line in path.read_text().splitlines()) == [0, 1, 2]
    await client.aclose()
