"""Sharded crawls (HA_SHARDS) against a real redis-server: placement, ids, fencing across
shards, children before acks, the lease rotation, counts and the shard-count check."""

from __future__ import annotations

import asyncio
import hashlib
from typing import TYPE_CHECKING

import pytest
import redis
import redis.asyncio
import scrapy
from fastapi.testclient import TestClient
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.cli.delayed import entries as delayed_entries
from scrapy_ha.cli.report import build_report
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.dashboard.app import create_app
from scrapy_ha.keys import Keys, shard_of, task_shard
from scrapy_ha.ops import operations
from scrapy_ha.ops.crawls import discover, read_crawls
from scrapy_ha.ops.shards import dead_letters
from scrapy_ha.scheduler.session.connect import _refuse_unsharded_features
from scrapy_ha.scheduler.session.start_urls import peek_start_urls
from scrapy_ha.store.sharding import check_shard_count, make_queue, shard_setting
from scrapy_ha.store.shards import ShardedQueue
from scrapy_ha.store.wire import Fresh, NewEntry

if TYPE_CHECKING:
    from scrapy_ha.store.queue import RedisQueue

LEASE_MS = 30000


def fp(name: str) -> bytes:
    return hashlib.sha1(name.encode()).digest()[:12]


def entry(name: str, parent: tuple[str, str] | None = None, task: str = "") -> NewEntry:
    return NewEntry(fp(name), 0, f"payload-{name}".encode(), parent, task=task)


def sharded(url: str, shards: int = 4, worker: str = "w1") -> ShardedQueue:
    client = redis.asyncio.Redis.from_url(url)
    queue = make_queue(client, "ha", "s", shards, worker=worker)
    assert isinstance(queue, ShardedQueue)
    return queue


async def lease_all(queue: RedisQueue, n: int = 1000) -> list:
    leases: list = []
    while True:
        got = (await queue.sync(lease=n, lease_ms=LEASE_MS)).leases
        if not got:
            return leases
        leases += got


def test_placement_is_by_fingerprint_and_stable():
    names = [f"https://example.com/{i}" for i in range(400)]
    first = [shard_of(fp(n), 4) for n in names]
    assert first == [shard_of(fp(n), 4) for n in names]  # the same every time
    assert {first.count(s) for s in range(4)} and min(first.count(s) for s in range(4)) > 60
    assert shard_of(bytes.fromhex("00000005") + b"x" * 8, 4) == 1  # the first 4 bytes, mod N


def test_one_shard_keeps_every_key_name_of_an_unsharded_crawl():
    assert Keys("ha", "books").ready == "ha:{books}:ready"
    assert Keys("ha", "books", 5, 6).ready == "ha:{books:5}:ready"
    assert Keys("ha", "books", 5, 6).queue("0:a.test") == "ha:{books:5}:q:0:a.test"
    sharded_cp = Keys("ha", "books", 0, 6).checkpoint("t1")
    assert sharded_cp == f"ha:{{books:{task_shard('t1', 6)}}}:cp:t1"
    assert Keys("ha", "books").checkpoint("t1") == "ha:{books}:cp:t1"


@pytest.mark.parametrize("value", [0, "x", -1, 2.5])
def test_a_wrong_shard_count_is_a_config_error_naming_the_setting(value):
    with pytest.raises(ConfigError, match=f"HA_SHARDS={value!r}"):
        shard_setting(Settings({"HA_SHARDS": value}))


@deferred_f_from_coro_f
async def test_requests_spread_over_the_shards_by_fingerprint(redis_url):
    q = sharded(redis_url)
    names = [f"u{i}" for i in range(200)]
    assert (await q.sync(enqueue=[entry(n) for n in names])).added == 200
    raw = redis.asyncio.Redis.from_url(redis_url)
    for s in range(4):
        members = await raw.lrange(f"ha:{{s:{s}}}:q:0:-", 0, -1)  # priority 0, no host
        stored = {m.split(b" ", 1)[1].decode().removeprefix("payload-") for m in members}
        assert stored == {n for n in names if shard_of(fp(n), 4) == s}
        assert stored  # every shard has some
    assert (await q.counts()).pending == 200
    await raw.aclose()
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_the_same_url_from_two_workers_is_queued_once(redis_url):
    a, b = sharded(redis_url, worker="a"), sharded(redis_url, worker="b")
    names = [f"u{i}" for i in range(50)]
    added_a = (await a.sync(enqueue=[entry(n) for n in names])).added
    added_b = (await b.sync(enqueue=[entry(n) for n in reversed(names)])).added
    assert (added_a, added_b) == (50, 0)
    leases = await lease_all(a) + await lease_all(b)
    assert sorted(x.payload for x in leases) == sorted(f"payload-{n}".encode() for n in names)
    await a.client.aclose()
    await b.client.aclose()


@deferred_f_from_coro_f
async def test_ids_of_shards_do_not_collide_and_acks_go_home(redis_url):
    q = sharded(redis_url)
    await q.sync(enqueue=[entry(f"u{i}") for i in range(40)])
    leases = await lease_all(q)
    assert len({x.id for x in leases}) == 40
    assert {q.route(x.id)[0] for x in leases} == {0, 1, 2, 3}
    result = await q.sync(ack=[(x.id, x.token) for x in leases])
    assert (result.acked, result.stale) == (40, 0)
    counts = await q.counts()
    assert (counts.pending, counts.leased) == (0, 0)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_the_rotation_leases_from_every_shard(redis_url):
    q = sharded(redis_url)
    await q.sync(enqueue=[entry(f"u{i}") for i in range(400)])
    firsts = []
    for _ in range(8):  # two turns of the rotation, one lease each
        (lease,) = (await q.sync(lease=1, lease_ms=LEASE_MS)).leases
        firsts.append(q.route(lease.id)[0])
    assert firsts == [0, 1, 2, 3, 0, 1, 2, 3]
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_round_goes_on_to_the_next_shards_while_it_wants_more(redis_url):
    q = sharded(redis_url)
    names = [n for n in (f"u{i}" for i in range(200)) if shard_of(fp(n), 4) == 2][:3]
    await q.sync(enqueue=[entry(n) for n in names])
    result = await q.sync(lease=10, lease_ms=LEASE_MS)  # starts at shard 0: empty
    assert len(result.leases) == 3
    assert result.pending == 0 and result.leased == 3  # the whole crawl's counts
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_lost_parents_child_in_another_shard_is_refused(redis_url):
    q = sharded(redis_url)
    await q.sync(enqueue=[entry("parent")])
    (parent,) = (await q.sync(lease=1, lease_ms=LEASE_MS)).leases
    home = q.route(parent.id)[0]
    other = next(n for n in (f"c{i}" for i in range(100)) if shard_of(fp(n), 4) != home)
    same = next(n for n in (f"c{i}" for i in range(100)) if shard_of(fp(n), 4) == home)
    # another worker reclaimed the page: this worker's token is no longer current
    raw = redis.asyncio.Redis.from_url(redis_url)
    local = q.route(parent.id)[1]
    key = f"ha:{{s:{home}}}:leases"
    record = (await raw.hget(key, local)).split(b" ", 1)[1]
    await raw.hset(key, local, b"someone-else-1 " + record)
    result = await q.sync(enqueue=[entry(other, (parent.id, parent.token))])
    assert (result.added, result.refused) == (0, 1)
    result = await q.sync(enqueue=[entry(same, (parent.id, parent.token))])
    assert (result.added, result.refused) == (0, 1)  # as today, in the parent's own shard
    assert (await q.counts()).pending == 0
    # a current parent's child in another shard is stored
    await raw.hset(key, local, parent.token.encode() + b" " + record)
    result = await q.sync(enqueue=[entry(other, (parent.id, parent.token))])
    assert (result.added, result.refused) == (1, 0)
    await raw.aclose()
    await q.client.aclose()


class Recording(redis.asyncio.Redis):
    """Records the shard and kind (enqueue/ack) of each sync script call."""

    calls: list[tuple[str, int, int]]

    def _record(self, numkeys, keys_and_args):
        keys = keys_and_args[:numkeys]
        args = keys_and_args[numkeys:]
        if numkeys >= 18 and str(keys[0]).endswith(":q:"):
            self.calls.append((str(keys[0]), int(args[0]), int(args[1])))

    async def evalsha(self, sha, numkeys, *keys_and_args):  # type: ignore[override]
        self._record(numkeys, keys_and_args)
        return await super().evalsha(sha, numkeys, *keys_and_args)

    async def fcall(self, function, numkeys, *keys_and_args):  # type: ignore[override]
        self._record(numkeys, keys_and_args)  # the sync script as a function (Redis 7+)
        return await super().fcall(function, numkeys, *keys_and_args)


@deferred_f_from_coro_f
async def test_every_child_is_stored_before_any_ack_across_shards(redis_url):
    client = Recording.from_url(redis_url)
    client.calls = []
    q = make_queue(client, "ha", "s", 4, worker="w1")
    await q.sync(enqueue=[entry(f"p{i}") for i in range(8)])
    parents = await lease_all(q)
    children = [entry(f"c{i}", (p.id, p.token)) for i, p in enumerate(parents)]
    children += [entry(f"d{i}", (p.id, p.token)) for i, p in enumerate(parents)]
    client.calls.clear()
    result = await q.sync(enqueue=children, ack=[(p.id, p.token) for p in parents])
    assert (result.added, result.acked, result.refused) == (16, 8, 0)
    kinds = [(n_enq > 0, n_ack > 0) for _, n_enq, n_ack in client.calls]
    last_child = max(i for i, (enq, _) in enumerate(kinds) if enq)
    first_ack = min(i for i, (_, ack) in enumerate(kinds) if ack)
    assert last_child < first_ack
    assert len({key for key, n_enq, _ in client.calls if n_enq}) > 1  # children in several
    await client.aclose()


@deferred_f_from_coro_f
async def test_requests_of_a_task_stay_in_its_shard_with_its_checkpoint(redis_url):
    q = sharded(redis_url, shards=3)
    home = task_shard("cats", 3)
    await q.sync(enqueue=[entry(f"page{i}", task="cats") for i in range(12)])
    leases = await lease_all(q)
    assert {q.route(x.id)[0] for x in leases} == {home}
    page = leases[0]
    assert await q.save_checkpoint(page.id, page.token, "cats", b'{"page": 2}', 60000)
    raw = redis.asyncio.Redis.from_url(redis_url)
    assert await raw.get(f"ha:{{s:{home}}}:cp:cats") == b'{"page": 2}'
    await raw.aclose()
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_reclaim_and_release_work_in_every_shard(redis_url):
    q = sharded(redis_url, shards=3)
    try:
        await q.sync(enqueue=[entry(f"u{i}") for i in range(30)])
        leases = await q.sync(lease=30, lease_ms=1)
        assert len(leases.leases) == 30
        # the leases expire 1 ms of Redis time after each shard's lease: a call may find
        # some shards' expired and not the others' yet, so count over the calls
        reclaimed = 0
        for _ in range(100):
            result = await q.reclaim(worker="w2", interval_ms=1, batch=100, max_expiries=3)
            reclaimed += result.reclaimed if result else 0
            if reclaimed >= 30:
                break
        assert reclaimed == 30
        again = await lease_all(q)
        assert await q.release([(x.id, x.token) for x in again]) == 30
        assert (await q.counts()).pending == 30
    finally:
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_sync_gives_leases_back_in_their_own_shards(redis_url):
    q = sharded(redis_url, shards=3)
    try:
        await q.sync(enqueue=[entry(f"u{i}") for i in range(30)])
        held = [(x.id, x.token) for x in await lease_all(q)]
        result = await q.sync(ack=held[:10], release=held[10:25])
        assert (result.acked, result.released) == (10, 15)
        counts = await q.counts()
        assert (counts.pending, counts.leased) == (15, 5)
        assert (await q.sync(release=held[10:25])).released == 0  # stale: given back once
    finally:
        await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_worker_with_another_shard_count_is_refused(redis_url):
    client = redis.asyncio.Redis.from_url(redis_url)
    four = make_queue(client, "ha", "s", 4)
    await check_shard_count(four)
    await four.sync(enqueue=[entry("a")])
    with pytest.raises(ConfigError, match=r"HA_SHARDS=3 .* HA_SHARDS=4"):
        await check_shard_count(make_queue(client, "ha", "s", 3))
    with pytest.raises(ConfigError, match=r"HA_SHARDS=1 .* HA_SHARDS=4"):
        await check_shard_count(make_queue(client, "ha", "s", 1))
    await four.flush()
    assert not await four.exists()
    one = make_queue(client, "ha", "s", 1)
    await one.sync(enqueue=[entry("a")])
    await check_shard_count(one)
    assert not await client.exists("ha:{s}:shards")  # an unsharded crawl writes nothing new
    with pytest.raises(ConfigError, match=r"HA_SHARDS=2 but .* unsharded"):
        await check_shard_count(make_queue(client, "ha", "s", 2))
    await client.aclose()


@deferred_f_from_coro_f
async def test_the_dead_letters_of_every_shard_are_listed_requeued_and_purged(redis_url):
    q = sharded(redis_url, shards=3)
    await q.sync(enqueue=[entry(f"u{i}") for i in range(12)])
    leases = await lease_all(q)
    for x in leases:
        assert await q.dead_letter(x.id, x.token, {"class": "gone", "reason": "404"})
    dlq = dead_letters(q)
    listed = await dlq.entries()
    assert sorted(e.id for e in listed) == sorted(x.id for x in leases)
    assert [e.dead_at for e in listed] == sorted(e.dead_at for e in listed)  # oldest first
    assert len({q.route(e.id)[0] for e in listed}) == 3
    page = await dlq.entries(offset=2, limit=5)
    assert [e.id for e in page] == [e.id for e in listed[2:7]]
    far = next(e for e in listed if q.route(e.id)[0] == 2)
    shown = await dlq.get(far.id)
    assert shown is not None and shown.id == far.id and shown.failure_class == "gone"
    assert await dlq.requeue([e.id for e in listed[:4]]) == 4
    assert await dlq.purge([e.id for e in listed[4:]]) == 8
    counts = await q.counts()
    assert (counts.pending, counts.dead) == (4, 0)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_the_exporter_reports_a_sharded_crawl_once_with_its_shards_summed(redis_url):
    q = sharded(redis_url, shards=3)
    await check_shard_count(q)
    await q.sync(enqueue=[entry(f"u{i}") for i in range(30)])
    await q.sync(lease=4, lease_ms=LEASE_MS)
    await q.sync(lease=4, lease_ms=LEASE_MS)  # from two shards
    assert await operations.pause(q, "test")
    client = redis.Redis.from_url(redis_url)
    assert discover(client, "ha") == ["s"]
    (numbers,) = read_crawls(client, "ha", ["s"])
    assert numbers.states == {"pending": 22, "leased": 8, "delayed": 0, "dead": 0}
    assert numbers.stats.counter("enqueued") == 30 and numbers.stats.fingerprints == 30
    assert numbers.paused
    client.close()
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_the_dashboard_shows_a_sharded_crawl_once_and_pauses_every_shard(redis_url):
    q = sharded(redis_url, shards=3)
    await check_shard_count(q)
    await q.sync(enqueue=[entry(f"u{i}") for i in range(30)])
    await q.client.aclose()
    await asyncio.to_thread(_drive_dashboard, redis_url)  # TestClient runs its own loop
    client = redis.Redis.from_url(redis_url)
    assert all(client.exists(f"ha:{{s:{i}}}:paused") for i in range(3))
    client.close()


@deferred_f_from_coro_f
async def test_a_sharded_crawl_whose_shard_0_is_empty_is_listed_once(redis_url):
    q = sharded(redis_url, shards=3)
    await check_shard_count(q)
    names = [n for n in (f"u{i}" for i in range(60)) if shard_of(fp(n), 3) == 1][:5]
    await q.sync(enqueue=[entry(n) for n in names])  # every one in shard 1, none in 0
    client = redis.Redis.from_url(redis_url)
    assert not client.keys("ha:{s:0}:*") and client.keys("ha:{s:1}:*")
    assert discover(client, "ha") == ["s"]  # not ["s", "s:1"]
    (numbers,) = read_crawls(client, "ha", ["s"])
    assert numbers.states["pending"] == 5
    client.close()
    await q.client.aclose()
    crawls = await asyncio.to_thread(_dashboard_crawls, redis_url)  # its own loop
    assert [(c["spider"], c["pending"]) for c in crawls] == [("s", 5)]


def _dashboard_crawls(redis_url: str) -> list[dict]:
    app = create_app(redis.asyncio.Redis.from_url(redis_url), "ha", close_client=True)
    with TestClient(app, base_url="http://127.0.0.1", follow_redirects=False) as http:
        return http.get("/api/crawls").json()["crawls"]


def _drive_dashboard(redis_url: str) -> None:
    app = create_app(redis.asyncio.Redis.from_url(redis_url), "ha", close_client=True)
    with TestClient(app, base_url="http://127.0.0.1", follow_redirects=False) as http:
        (crawl,) = http.get("/api/crawls").json()["crawls"]
        assert crawl["spider"] == "s" and crawl["pending"] == 30
        assert http.get("/api/crawls/s").json()["counters"]["enqueued"] == 30
        done = http.post("/api/crawls/s/actions/pause", json={})
        assert done.status_code == 200, done.text
        assert http.get("/api/crawls/s").json()["paused"]
        table = http.get("/api/crawls/s/dead")  # every shard's, merged (none dead yet)
        assert table.status_code == 200 and table.json()["entries"] == []


@deferred_f_from_coro_f
async def test_start_urls_are_fed_into_their_shards_and_leave_the_list(redis_url):
    q = sharded(redis_url, shards=3)
    raw = [f"https://example.com/{i}".encode() for i in range(12)]
    await q.client.rpush("s:start_urls", *raw)
    peeked = await peek_start_urls(q.client, "s:start_urls", as_set=False, batch=20)
    entries = [NewEntry(fp(u.decode()), 0, b"payload-" + u) for u in peeked]
    assert await q.feed("s:start_urls", as_set=False, raw=peeked, entries=entries) == 12
    assert await q.client.llen("s:start_urls") == 0
    assert (await q.counts()).pending == 12
    assert all([await s.client.zcard(s.keys.ready) for s in q.shards])
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_delayed_retries_of_every_shard_are_listed_and_made_due(redis_url):
    q = sharded(redis_url, shards=3)
    await q.sync(enqueue=[entry(f"u{i}") for i in range(9)])
    leases = await lease_all(q)
    for x in leases:
        assert await q.retry_later(x.id, x.token, 3_600_000, x.payload, 0, "server")
    listed = await delayed_entries(q)
    assert sorted(d.id for d in listed) == sorted(x.id for x in leases)
    assert len({q.route(d.id)[0] for d in listed}) == 3
    assert await operations.make_due(q, [d.id for d in listed]) == 9
    again = await lease_all(q)  # promoted by the next syncs, in every shard
    assert sorted(x.payload for x in again) == sorted(x.payload for x in leases)
    await q.client.aclose()


def fresh(name: str, n: int, parent: tuple[str, str] | None = None) -> NewEntry:
    """A request the worker handed out before Redis had it (its lease made by the worker)."""
    state = Fresh(scrapy.Request(f"https://example.com/{name}"), (f"abc.{n}", f"abc-{n}"))
    return NewEntry(fp(name), 0, f"payload-{name}".encode(), parent, state)


def named(shard: int, but: int = -1, stem: str = "n") -> str:
    return next(n for n in (f"{stem}{i}" for i in range(500)) if shard_of(fp(n), 3) == shard != but)


@deferred_f_from_coro_f
async def test_a_child_of_a_parent_sent_in_the_same_batch_to_another_shard_is_kept(redis_url):
    q = sharded(redis_url, shards=3)
    await q.sync(enqueue=[entry(named(1, stem="root"))])
    (root,) = (await q.sync(lease=1, lease_ms=LEASE_MS)).leases
    page = fresh(named(1, stem="page"), 1, (root.id, root.token))  # handed out from memory
    child = entry(named(2, stem="child"), ("abc.1", "abc-1"))  # yielded by that page
    result = await q.sync(enqueue=[page, child])
    assert (result.added, result.refused, result.dropped) == (2, 0, set())
    # the same again: the page is a duplicate now (dropped), so its child is refused
    page2 = fresh(named(1, stem="page"), 2, (root.id, root.token))
    child2 = entry(named(2, stem="other"), ("abc.2", "abc-2"))
    result = await q.sync(enqueue=[page2, child2])
    assert (result.added, result.refused, result.dropped) == (0, 1, {"abc.2"})
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_lost_lease_is_reported_by_the_id_the_worker_holds(redis_url):
    q = sharded(redis_url, shards=3)
    page = fresh(named(2, stem="page"), 7)
    await q.sync(enqueue=[page, entry(named(1))])
    (leased,) = (await q.sync(lease=1, lease_ms=LEASE_MS)).leases
    held = [("abc.7", "abc-7"), (leased.id, leased.token)]
    assert await q.renew(held, worker="w1", lease_ms=LEASE_MS, heartbeat_ms=60000) == (2, [])
    await q.release(held)  # gone from Redis: both are lost now
    q._taken["abc.7"] = 2  # the worker still holds it (as a zombie would)
    renewed, lost = await q.renew(held, worker="w1", lease_ms=LEASE_MS, heartbeat_ms=60000)
    assert (renewed, sorted(lost)) == (0, sorted(held))
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_the_report_counts_the_dead_letters_of_every_shard(redis_url):
    q = sharded(redis_url, shards=3)
    await check_shard_count(q)
    await q.sync(enqueue=[entry(f"u{i}") for i in range(9)])
    for x in await lease_all(q):
        assert await q.dead_letter(x.id, x.token, {"class": "gone", "reason": "404"})
    report = await build_report(q, 3600)
    assert report.window["dead"] == 9 and report.dead_by_class == {"gone": 9}
    assert report.states["dead"] == 9 and report.totals["enqueued"] == 9
    await q.client.aclose()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("HA_DOMAIN_RATE", 2.0),
        ("HA_DOMAIN_CONCURRENCY", 4),
        ("HA_DOMAIN_LIMITS", {"example.com": {"rate": 2}}),
    ],
)
def test_crawl_wide_domain_limits_are_refused_when_sharded(name, value):
    """Each shard's sync script keeps the limits of the requests it leases: sharded, every
    shard would allow the whole limit, so the site would see N times it."""
    settings = Settings({name: value, "HA_SHARDS": 3})
    with pytest.raises(ConfigError, match=f"{name} is not supported yet with HA_SHARDS=3"):
        _refuse_unsharded_features(settings, 3)
    _refuse_unsharded_features(settings, 1)
