"""The crawl-wide counters, kept by the scripts themselves, against a real redis-server:
every transition moves its counter once, per class and per domain, the per-minute buckets
are kept for a day, and a counter never makes a script fail half-way."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.keys import Keys
from scrapy_ha.ops.stats import CrawlStats, read_crawl_stats, read_crawl_stats_async
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry, Reclaimed

KEYS = Keys("ha", "s")
LEASE_MS = 30_000


def request(url: str, fp: bytes | None = None) -> NewEntry:
    payload = json.dumps({"v": 1, "u": url, "cb": "parse"}, separators=(",", ":")).encode()
    return NewEntry(url.encode()[-12:] if fp is None else fp, 0, payload)


def open_queue(url: str) -> RedisQueue:
    return RedisQueue(redis.asyncio.Redis.from_url(url), KEYS)


async def lease_all(q: RedisQueue) -> dict[str, tuple[str, str]]:
    """Every pending entry leased: URL -> (entry id, token)."""
    leases = await q.lease(100, LEASE_MS)
    return {json.loads(x.payload)["u"]: (x.id, x.token) for x in leases}


def minute_of(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int((seconds * 1000 + micros // 1000) // 60000)


@deferred_f_from_coro_f
async def test_each_transition_counts_once_per_class_and_domain(redis_url):
    q = open_queue(redis_url)
    urls = [
        "http://a.example/1",
        "https://user:pw@B.Example:8443/2?x=1",
        "http://a.example/3",
        "http://[::1]:8080/4",
    ]
    assert await q.enqueue([request(u) for u in urls] + [request(urls[0])]) == 4
    leased = await lease_all(q)
    a1, b2, a3, v6 = (leased[u] for u in urls)
    await q.ack([a1])
    await q.ack([a1])  # stale: not counted again
    assert await q.retry_later(*b2, 0, b"", failure_class="server")
    assert await q.retry_later(*a3, 0, b"")  # a deferral: no attempt, no count
    assert await q.dead_letter(*v6, {"class": "gone", "reason": "HTTP 404"})
    again = await lease_all(q)
    assert set(again) == set(urls[1:3])
    b2, a3 = again[urls[1]], again[urls[2]]
    await q.ack([b2, a3])  # b2 was retried once: a retry that succeeded

    s = read_crawl_stats(redis.Redis.from_url(redis_url), KEYS)
    assert (s.enqueued, s.filtered, s.acked, s.retried, s.dead_lettered) == (4, 0, 3, 1, 1)
    assert s.start_duplicates == 1  # a request without a parent page: not a link filtered
    assert (s.retry_ok, s.retry_dead, s.retry_success_rate) == (1, 0, 1.0)
    assert s.retried_by_class == {"server": 1} and s.dead_by_class == {"gone": 1}
    assert s.domains == {
        "a.example": {"enqueued": 2, "acked": 2},
        "b.example": {"enqueued": 1, "retried": 1, "acked": 1},
        "[::1]": {"enqueued": 1, "dead": 1},
    }
    assert (s.pending, s.leased, s.delayed, s.dead) == (0, 0, 0, 1)
    minute = s.now_ms // 60000
    assert sum(s.minutes["acked"].values()) == 3 and set(s.minutes["acked"]) <= {minute - 1, minute}
    assert s.rate("acked", 1) > 0 and s.eta_seconds() == 0.0
    assert (await read_crawl_stats_async(q.client, KEYS)).counters == s.counters
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_retried_request_that_ends_dead_and_the_operator_actions(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([request("http://c.example/1"), request("http://c.example/2")])
    one, two = (await lease_all(q)).values()
    await q.retry_later(*one, 0, b"", failure_class="timeout")
    await q.retry_later(*two, 0, b"", failure_class="server")
    one, two = (await lease_all(q)).values()
    await q.retry_later(*one, 0, b"", failure_class="timeout")
    await q.dead_letter(*two, {"class": "server", "reason": "HTTP 503"})
    (one,) = (await lease_all(q)).values()
    await q.dead_letter(*one, {"class": "timeout", "reason": "timed out"})
    assert await q.requeue_dead([(one[0], 0, request("http://c.example/1").payload)]) == 1
    assert await q.purge_dead([two[0]]) == (1, 0)  # (deleted, kept unarchived)
    (one,) = (await lease_all(q)).values()
    await q.ack([one])  # requeued with its attempts reset: not a retry that succeeded

    s = await read_crawl_stats_async(q.client, KEYS)
    assert s.retried_by_class == {"timeout": 2, "server": 1} and s.retried == 3
    assert s.dead_by_class == {"server": 1, "timeout": 1}
    assert (s.retry_ok, s.retry_dead, s.retry_success_rate) == (0, 2, 0.0)
    assert (s.requeued, s.purged, s.acked, s.enqueued) == (1, 1, 1, 2)
    assert s.domains["c.example"] == {"enqueued": 2, "retried": 3, "dead": 2, "acked": 1}
    assert not await q.client.exists(KEYS.retried)  # nothing of a finished entry is left
    await q.client.aclose()


async def reclaim_soon(q: RedisQueue) -> Reclaimed:
    """Reclaim until the 1 ms lease leased just before has expired and is reclaimed."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        await q.client.delete(KEYS.reclaim_guard)
        done = await q.reclaim(worker="w", interval_ms=1, batch=10, max_expiries=2)
        if done and (done.reclaimed or done.poison):
            return done
        await asyncio.sleep(0.01)
    raise AssertionError("the lease was never reclaimed")


@deferred_f_from_coro_f
async def test_reclaim_counts_reclaimed_and_poison(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([request("http://d.example/1")])
    (lease,) = await q.lease(1, LEASE_MS)
    await q.retry_later(lease.id, lease.token, 0, b"", failure_class="server")
    (first,) = await q.lease(1, 1000)  # handed to the engine, and its worker dies
    pair = (first.id, first.token)
    await q.renew([pair], handed=[pair], worker="w", lease_ms=1, heartbeat_ms=1000)
    assert (await reclaim_soon(q)).reclaimed == 1
    (again,) = await q.lease(1, 1000)  # handed to the engine, and its worker dies: poison
    pair = (again.id, again.token)
    await q.renew([pair], handed=[pair], worker="w", lease_ms=1, heartbeat_ms=1000)
    assert len((await reclaim_soon(q)).poison) == 1
    s = await read_crawl_stats_async(q.client, KEYS)
    assert (s.reclaimed, s.poison) == (1, 1)
    assert s.dead_by_class == {"poison": 1} and s.retry_dead == 1
    assert s.domains["d.example"] == {"enqueued": 1, "retried": 1, "dead": 1}
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_start_urls_fed_from_a_list_count_as_enqueued(redis_url):
    q = open_queue(redis_url)
    start = "s:start_urls"
    urls = [b"http://e.example/1", b"http://e.example/1"]
    await q.client.rpush(start, *urls)
    entries = [request(u.decode(), fp=b"same-fp") for u in urls]
    assert await q.feed(start, as_set=False, raw=urls, entries=entries) == 1
    s = await read_crawl_stats_async(q.client, KEYS)
    assert (s.enqueued, s.start_duplicates, s.domains) == (1, 1, {"e.example": {"enqueued": 1}})
    assert s.filtered == 0  # a start URL fed twice is a duplicate start request
    await q.client.aclose()


def _bucket_fields(client: redis.Redis) -> set[str]:
    return {k.decode() for k in client.hkeys(KEYS.stats_minutes)}


@pytest.mark.parametrize("pause", [10, 3000])
@deferred_f_from_coro_f
async def test_buckets_older_than_a_day_are_pruned(redis_url, redis_client, pause):
    """A crawl that goes on (pause 10 minutes) or comes back after two days (3000): the
    first bucket of a new minute drops every bucket that left the day, none of the day's."""
    m = minute_of(redis_client)
    last = m - pause
    if pause < 1000:
        old, kept = (
            {f"acked:{last - 1439}", f"acked:{m - 1445}"},
            {f"acked:{last}", f"acked:{m - 1000}"},
        )
    else:
        old, kept = {f"acked:{last - 1439}", f"acked:{last}"}, set()
    redis_client.hset(
        KEYS.stats_minutes, mapping={**{f: 5 for f in old | kept}, "acked:last": last}
    )
    q = open_queue(redis_url)
    await q.enqueue([request("http://f.example/1")])
    (lease,) = await q.lease(1, LEASE_MS)
    await q.ack([(lease.id, lease.token)])
    await q.client.aclose()

    now = minute_of(redis_client)
    left = {k.decode() for k in redis_client.hkeys(KEYS.stats_minutes)}
    assert kept <= left and not old & left
    assert {f"acked:{now}", f"acked:{m}"} & left
    assert int(redis_client.hget(KEYS.stats_minutes, "acked:last")) in (m, now)
    s = read_crawl_stats(redis_client, KEYS)
    assert all(now - minute <= 1440 for minute in s.minutes["acked"])


@deferred_f_from_coro_f
async def test_garbage_in_a_counter_restarts_it_a_stats_key_of_another_type_fails_first(
    redis_url,
):
    q = open_queue(redis_url)
    await q.client.hset(KEYS.stats, "acked", "garbage")
    await q.enqueue([request("http://g.example/1"), request("http://g.example/2")])
    one, two = (await lease_all(q)).values()
    await q.ack([one])
    assert (await read_crawl_stats_async(q.client, KEYS)).acked == 1  # restarted, not stuck

    await q.client.delete(KEYS.stats_domains)
    await q.client.set(KEYS.stats_domains, "not a hash")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        await q.ack([two])
    assert await q.client.zscore(KEYS.leased, two[0]) is not None  # nothing changed
    assert await q.client.get(KEYS.stats_domains) == b"not a hash"
    await q.client.aclose()


def test_rates_span_the_window_and_the_eta_divides_what_is_left_by_the_ack_rate():
    m = 29_000_000
    stats = CrawlStats(
        m * 60_000 + 30_000,
        90,
        20,
        10,
        0,
        1,
        0,
        spider="s",
        minutes={"acked": {m: 30, m - 1: 60, m - 4: 10, m - 5: 40, m - 100: 1000}},
    )
    assert stats.rate("acked", 1) == 30 + 60 / 2  # half of the minute before is in the window
    assert stats.rate("acked", 5) == (30 + 60 + 10 + 40 / 2) / 5
    assert stats.rate("acked", 60) == (30 + 60 + 10 + 40) / 60
    assert stats.rate("dead", 5) == 0.0
    assert stats.eta_seconds(5) == 120 / 24 * 60  # 120 left at 24 a minute: 5 minutes
    assert CrawlStats(0, 1, 0, 0, 0, 0, 0, spider="s").eta_seconds() is None  # nothing acked lately


PAGE = request("http://h.example/1").payload
RETENTION = {"max_entries": 100, "max_age_ms": 10**9}
#: The scripts that count, and the counter keys each takes (the retried hash where it reads it).
COUNTING = {
    "ack": ("stats", "stats_minutes", "stats_domains", "retried"),
    "retry": ("stats", "stats_minutes", "stats_domains", "retried"),
    "dead": ("stats", "stats_minutes", "stats_domains", "retried"),
    "reclaim": ("stats", "stats_minutes", "stats_domains", "retried"),
    "requeue": ("stats", "stats_minutes", "stats_domains"),
    "purge": ("stats", "stats_minutes", "stats_domains"),
    "feed": ("stats", "stats_minutes", "stats_domains"),
}


async def prepared(q: RedisQueue, op: str):
    """The state *op* acts on, and the call that does it (it returns something true)."""
    if op == "feed":
        await q.client.rpush("s:start_urls", "http://h.example/1")
        raw = await q.client.lrange("s:start_urls", 0, 9)
        return lambda: q.feed("s:start_urls", as_set=False, raw=raw, entries=[request("x")])
    await q.enqueue([request("http://h.example/1")])
    (lease,) = await q.lease(1, 1 if op == "reclaim" else LEASE_MS)
    pair = (lease.id, lease.token)
    if op in ("requeue", "purge"):
        await q.dead_letter(*pair, {"class": "gone"}, **RETENTION)
    calls = {
        "ack": lambda: q.sync(ack=[pair]),
        "retry": lambda: q.retry_later(*pair, 1000, b"", failure_class="server"),
        "dead": lambda: q.dead_letter(*pair, {"class": "gone"}, **RETENTION),
        "reclaim": lambda: q.reclaim(worker="w", interval_ms=1, batch=10, max_expiries=3),
        "requeue": lambda: q.requeue_dead([(lease.id, 0, PAGE)]),
        "purge": lambda: q.purge_dead([lease.id]),
    }
    return calls[op]


async def snapshot(client) -> dict[bytes, bytes]:
    return {key: await client.dump(key) for key in sorted(await client.keys("*"))}


@pytest.mark.parametrize(
    ("op", "key"), [(op, key) for op, keys in COUNTING.items() for key in keys]
)
@deferred_f_from_coro_f
async def test_a_counter_key_of_another_type_fails_the_script_before_its_first_write(
    redis_url, op, key
):
    q = open_queue(redis_url)
    call = await prepared(q, op)
    await asyncio.sleep(0.01)  # a 1 ms lease has expired
    bad = getattr(KEYS, key)
    await q.client.delete(bad)
    await q.client.set(bad, "garbage")
    before = await snapshot(q.client)
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        await call()
    assert await snapshot(q.client) == before  # all or nothing
    await q.set_aside_wrong_types()
    done = await call()
    assert done.acked if op == "ack" else (done.reclaimed if op == "reclaim" else done)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_dead_letter_without_a_class_counts_as_unknown(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([request("http://i.example/1"), request("http://i.example/2")])
    one, two = (await lease_all(q)).values()
    assert await q.dead_letter(*one, {"reason": "no class"})
    assert await q.dead_letter(*two, {"class": None, "reason": "a null class"})
    assert (await read_crawl_stats_async(q.client, KEYS)).dead_by_class == {"unknown": 2}
    await q.client.aclose()


@pytest.mark.parametrize("garbage", ["-inf", "-1e300", "-9007199254740993", "1e300", "nan", "-5"])
@deferred_f_from_coro_f
async def test_a_garbage_last_minute_is_read_as_missing_never_loops(tmp_path, garbage):
    """'<event>:last' is data. Before: -inf or a minute below -2^53 made prune's loop endless
    (m + 1 == m) after the script had written: Redis BUSY and SCRIPT KILL refused. A Redis of
    the test's own, killed at the end, and a client that gives up: a failure cannot hang the
    suite's Redis."""
    from tests.conftest import RedisServer  # noqa: PLC0415

    server = RedisServer(tmp_path / "redis")
    server.start()
    q = RedisQueue(redis.asyncio.Redis.from_url(server.url, socket_timeout=5), KEYS)
    try:
        await q.enqueue([request("http://k.example/1")])
        (lease,) = await q.lease(1, LEASE_MS)
        await q.client.hset(KEYS.stats_minutes, "retried:last", garbage)
        assert await q.retry_later(lease.id, lease.token, 0, b"", failure_class="server")
        last = await q.client.hget(KEYS.stats_minutes, "retried:last")
        assert int(last) == minute_of(redis.Redis.from_url(server.url))
        assert await q.client.ping()
    finally:
        server.stop(kill=True)
        await q.client.aclose()


def test_the_eta_of_a_young_crawl_takes_the_rate_since_it_began():
    """As seen on a crawl held at 10 pages/s (HA_DOMAIN_RATE=10), 25 s after its start:
    251 acked, 149 left. Its rate was 10 a second, its ETA 15 s; `status` said 35 s (the
    251 taken as a minute's acks). A crawl older than the window is read as before."""
    from scrapy_ha.ops.waiting import Waiting, eta

    m = 29_000_000
    begun = m * 60_000 + 20_000
    stats = CrawlStats(begun + 25_100, 149, 0, 0, 0, 1, 0, spider="s", minutes={"acked": {m: 251}})
    # without the run's start: from the start of the first ack's minute (45 s), not 60 s
    assert round(eta(stats, Waiting()).seconds or 0) == round(149 / (251 / 45.1))
    assert round(eta(stats, Waiting(), begun_ms=begun).seconds or 0) == 15
    # a run begun 30 s ago on a crawl acked for days: its acks since then, not 5 minutes'
    resumed = CrawlStats(
        begun + 30_000, 300, 0, 0, 0, 1, 0, spider="s", minutes={"acked": {m: 300, m - 2000: 9}}
    )
    assert round(eta(resumed, Waiting(), begun_ms=begun).seconds or 0) == 30
    old = CrawlStats(
        m * 60_000 + 30_000,
        120,
        0,
        0,
        0,
        1,
        0,
        spider="s",
        minutes={"acked": {m: 30, m - 1: 60, m - 4: 10, m - 5: 40}},
    )
    assert eta(old, Waiting(), begun_ms=begun - 3_600_000).seconds == 120 / 24 * 60


def test_the_dashboard_pace_of_a_young_run_is_its_acks_over_its_time():
    """As seen: a run begun 22 s into its minute had 302 acks 17 s later (17.8 pages/s); the
    dashboard's pages_per_s read 7.56 (the acks over the 39 s of the minute so far)."""
    from scrapy_ha.dashboard._chart import speed

    m = 29_000_000
    begun = m * 60_000 + 22_000
    stats = CrawlStats(begun + 17_000, 0, 0, 0, 0, 1, 0, spider="s", minutes={"acked": {m: 302}})
    assert round(speed(stats), 2) == round(302 / 39, 2)  # what it read, and reads without it
    assert round(speed(stats, begun), 1) == 17.8
    # a run begun in the minute before: its acks of both minutes over the time since
    later = CrawlStats(
        begun + 50_000, 0, 0, 0, 0, 1, 0, spider="s", minutes={"acked": {m: 380, m + 1: 120}}
    )
    assert speed(later, begun) == 500 / 50
    # a run older than a minute: the last minute, as before
    old = CrawlStats(begun + 90_000, 0, 0, 0, 0, 1, 0, spider="s", minutes={"acked": {m + 1: 600}})
    assert speed(old, begun) == speed(old)
