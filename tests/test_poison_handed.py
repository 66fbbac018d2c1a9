"""Only the expiry of a lease whose request had been handed to the engine counts toward
poison, on a real redis-server: a worker that dies with a full buffer makes none of the
buffered requests suspect, while a request that kills the worker running it still ends in
the dead-letter queue (the scripts driven directly, and the keeper thread that reports)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.session.keeper import LeaseKeeper
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry

KEYS = Keys("ha", "poison")
KILLER_SPIDER = Path(__file__).resolve().parent / "worker_fault_spider.py"
#: The catalogue page whose callback kills its worker, and the item it would have stored.
KILL_PATH, KILL_ID = "/item/3", 3
#: Leases this short expire within a test; the reclaim below waits for them by polling.
LEASE_MS = 50


def open_queue(url: str) -> RedisQueue:
    return RedisQueue(redis.asyncio.Redis.from_url(url), KEYS)


def entry(name: str) -> NewEntry:
    return NewEntry(name.encode(), 0, f'{{"v":1,"u":"http://a.test/{name}"}}'.encode())


async def reclaim_all(q: RedisQueue, n: int) -> list[str]:
    """Reclaim until *n* leases came back or went dead; return the ids dead as poison."""
    poison: list[str] = []
    done = 0
    deadline = time.monotonic() + 30
    while done < n:
        assert time.monotonic() < deadline, f"only {done} of {n} leases reclaimed"
        await asyncio.sleep(0.02)
        result = await q.reclaim(worker="peer", interval_ms=1, batch=100, max_expiries=3)
        if result is not None:
            done += result.reclaimed + len(result.poison)
            poison += result.poison
    return poison


async def worker_dies(q: RedisQueue, handed: set[str]) -> dict[str, str]:
    """A worker leases everything, reports the requests named in *handed* as given to its
    engine (the renewal it makes anyway), then dies: every lease expires."""
    leases = (await q.sync(lease=100, lease_ms=LEASE_MS, promote=10)).leases
    by_name = {json.loads(lease.payload)["u"].rsplit("/", 1)[1]: lease for lease in leases}
    pairs = [(lease.id, lease.token) for lease in leases]
    running = [(lease.id, lease.token) for name, lease in by_name.items() if name in handed]
    await q.renew(pairs, handed=running, worker="w", lease_ms=LEASE_MS, heartbeat_ms=1000)
    return {name: lease.id for name, lease in by_name.items()}


@deferred_f_from_coro_f
async def test_buffered_leases_that_expire_again_and_again_are_not_poison(redis_url):
    q = open_queue(redis_url)
    await q.sync(enqueue=[entry(name) for name in ("killer", "b1", "b2", "b3")])
    dead: list[str] = []
    for _ in range(3):  # three worker deaths, the killer running each time
        ids = await worker_dies(q, handed={"killer"})
        dead += await reclaim_all(q, len(ids))
    assert dead == [ids["killer"]]
    info = json.loads(await q.client.hget(KEYS.dead_info, ids["killer"]))
    assert info["class"] == "poison" and info["expiries"] == 3
    counts = await q.counts()
    assert (counts.pending, counts.leased, counts.dead) == (3, 0, 1)
    # the buffered ones expired three times, none of them counted toward poison ...
    assert await q.client.hget(KEYS.expiries, ids["b1"]) == b"0 3"
    # ... but the worker still learns of every expiry, to run a suspect alone
    leases = (await q.sync(lease=100, lease_ms=LEASE_MS, promote=10)).leases
    assert sorted(lease.expiries for lease in leases) == [3, 3, 3]
    for _ in range(2):  # and more deaths with them only buffered change nothing
        await reclaim_all(q, len(leases))
        leases = (await q.sync(lease=100, lease_ms=LEASE_MS, promote=10)).leases
    assert len(leases) == 3 and await q.client.zcard(KEYS.dead) == 1
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_handed_expiries_add_up_across_buffered_ones(redis_url):
    """Counted and buffered expiries are kept apart: two counted ones and any number of
    buffered ones leave the request pending; the third counted one is poison."""
    q = open_queue(redis_url)
    await q.sync(enqueue=[entry("flaky")])
    for handed in ({"flaky"}, set(), {"flaky"}, set()):
        ids = await worker_dies(q, handed=handed)
        assert await reclaim_all(q, 1) == []
    assert await q.client.hget(KEYS.expiries, ids["flaky"]) == b"2 4"
    await worker_dies(q, handed={"flaky"})
    assert await reclaim_all(q, 1) == [ids["flaky"]]
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_an_expiry_count_of_older_data_or_garbage_is_read(redis_url):
    q = open_queue(redis_url)
    await q.sync(enqueue=[entry("old"), entry("junk")])
    leases = (await q.sync(lease=2, lease_ms=LEASE_MS, promote=10)).leases
    by_name = {json.loads(lease.payload)["u"].rsplit("/", 1)[1]: lease for lease in leases}
    await q.client.hset(KEYS.expiries, by_name["old"].id, "2")  # before counts were split
    await q.client.hset(KEYS.expiries, by_name["junk"].id, "inf")
    pairs = [(lease.id, lease.token) for lease in leases]
    await q.renew(pairs, handed=pairs, worker="w", lease_ms=LEASE_MS, heartbeat_ms=1000)
    assert await reclaim_all(q, 2) == [by_name["old"].id]  # 2 counted + this one
    assert await q.client.hget(KEYS.expiries, by_name["junk"].id) == b"1 1"
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_the_keeper_marks_what_the_engine_was_handed(redis_url):
    q = open_queue(redis_url)
    await q.sync(enqueue=[entry("running"), entry("buffered")])
    leases = (await q.sync(lease=2, lease_ms=30000, promote=10)).leases
    running, buffered = ((lease.id, lease.token) for lease in leases)
    keeper = LeaseKeeper(
        redis.Redis.from_url(redis_url),
        KEYS,
        worker="w",
        lease_time=30,
        renew_interval=10,
        heartbeat_ttl=30,
        watchdog=300,
        loop=asyncio.get_running_loop(),
        on_renewed=lambda started, lost, workers: None,
    )
    keeper.hold((running, buffered))
    keeper.hand((running,))
    keeper.renew_once()
    assert keeper.confirmed == {running}
    records = await q.client.hgetall(KEYS.leases)
    assert records[running[0].encode()].endswith(b" h")
    assert not records[buffered[0].encode()].endswith(b" h")
    keeper.renew_once()  # marked once: the record does not grow
    assert await q.client.hget(KEYS.leases, running[0]) == records[running[0].encode()]
    keeper.stop()
    await q.client.aclose()


def killer_worker(
    redis_url: str, site_url: str, tmp: Path, name: str, **extra: str
) -> subprocess.Popen[bytes]:
    settings = {
        "SCHEDULER": "scrapy_ha.Scheduler",
        "REDIS_URL": redis_url,
        "ITEMS_FILE": str(tmp / "items.jl"),
        "FAULT": "kill",
        "FAULT_PATH": KILL_PATH,
        "HA_LEASE_TIME": "3",
        "HA_LEASE_RENEW_INTERVAL": "1",
        "HA_HEARTBEAT_TTL": "3",
        "HA_RECLAIM_INTERVAL": "1",
        "HA_IDLE_TIMEOUT": "1",
        "CONCURRENT_REQUESTS": "4",
        "LOG_LEVEL": "INFO",
        **extra,
    }
    args = [sys.executable, "-m", "scrapy.cmdline", "runspider", str(KILLER_SPIDER)]
    args += ["-a", "name=killer", "-a", f"base_url={site_url}"]
    for key, value in settings.items():
        args += ["-s", f"{key}={value}"]
    env = {**os.environ, "PYTHONPATH": str(KILLER_SPIDER.parent.parent)}
    with (tmp / f"{name}.log").open("wb") as out:
        return subprocess.Popen(args, cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT)


@pytest.mark.long
@pytest.mark.parametrize(
    ("delay", "leases", "most_deaths"),
    [
        # the page kills its worker within milliseconds of being handed out, maybe before
        # the early renewal reports it: up to 2 x 3 - 1 deaths
        ("0", {}, 5),
        # 0.6 s after the hand-out, long before the periodic renewal (every 3 s) but after
        # the early one: every death counts
        ("0.6", {"HA_LEASE_TIME": "6", "HA_LEASE_RENEW_INTERVAL": "3", "HA_HEARTBEAT_TTL": "6"}, 3),
    ],
    ids=["at-once", "after-0.6s"],
)
def test_a_request_that_kills_its_worker_ends_as_poison(
    redis_url, redis_client, site_factory, tmp_path, delay, leases, most_deaths
):
    """A page that kills its worker ends in the dead-letter queue (as a suspect it runs
    alone, and only once Redis knows), and every other page is crawled, none
    dead-lettered."""
    site = site_factory("--pages", "3", "--per-page", "5", "--delay", delay)
    deaths = 0
    for run in range(12):
        proc = killer_worker(redis_url, site.url, tmp_path, f"w{run}", **leases)
        code = proc.wait(timeout=120)
        if code == 0:
            break
        assert code == -signal.SIGKILL, (tmp_path / f"w{run}.log").read_text()[-3000:]
        deaths += 1
    else:
        raise AssertionError(f"the killer was never dead-lettered after {deaths} deaths")
    log = (tmp_path / f"w{run}.log").read_text()
    assert "'finish_reason': 'finished'" in log
    (dead_id,) = redis_client.zrange("ha:{killer}:dead", 0, -1)
    info = json.loads(redis_client.hget("ha:{killer}:dead_info", dead_id))
    assert info["class"] == "poison", info
    assert KILL_PATH.encode() in redis_client.hget("ha:{killer}:payload", dead_id)
    ids = {json.loads(line)["id"] for line in (tmp_path / "items.jl").read_text().splitlines()}
    assert ids == set(range(1, 16)) - {KILL_ID}
    # counted from its first run alone at the latest: max-1 uncounted deaths, then max
    assert 3 <= deaths <= most_deaths, deaths


@deferred_f_from_coro_f
async def test_a_request_handed_out_before_redis_had_it_is_stored_as_handed(redis_url):
    """A request handed out from memory is in the engine before the round that stores it: it
    is stored marked as handed, so that its expiry counts toward poison without an early
    report from the lease keeper (before: only the keeper's report marked it, one more
    renewal call for every such request)."""
    from scrapy import Request

    from scrapy_ha.store.wire import Fresh

    q = open_queue(redis_url)
    taken = NewEntry(
        b"fp-t", 0, b'{"v":1,"u":"http://a.test/t"}', fresh=Fresh(Request("http://a.test/t"))
    )
    assert taken.fresh is not None
    taken.fresh.lease = ("f00d.1", "f00d-1")
    await q.sync(enqueue=[taken], lease=0, lease_ms=LEASE_MS, worker="w1")
    assert await reclaim_all(q, 1) == []
    assert await q.client.hget(KEYS.expiries, "f00d.1") == b"1 1"  # counted toward poison
    await q.client.aclose()
