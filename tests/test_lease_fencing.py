"""Lease fencing between the event loop and the keeper thread, on a real redis-server: a
sync's leases are renewed before the loop reads its reply, a lost lease is dropped by
(id, token) and never the same entry re-leased under a new token, a child refused by the
parent fence is not remembered as seen, and a worker that left is not re-registered by a
late renewal."""

from __future__ import annotations

import asyncio
import contextlib
import time

import redis
import redis.asyncio
from scrapy import Request
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha import metakeys
from scrapy_ha.config.scheduler import SchedulerConfig
from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.outbox import EndOp
from scrapy_ha.scheduler.session.keeper import LeaseKeeper
from scrapy_ha.scheduler.shell import Scheduler
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry

KEYS = Keys("ha", "fence")
PAGE = b'{"v":1,"u":"http://a.test/list1"}'
#: Seconds of the lease the keeper renews every 50 ms: longer than a stall of a loaded
#: machine between two renewals, short enough to outlive it twice in a test.
RENEWED_LEASE = 1.5


def keeper(
    url: str, worker: str, *, got: list | None = None, interval: float = 10, lease_time: float = 30
) -> LeaseKeeper:
    return LeaseKeeper(
        redis.Redis.from_url(url),
        KEYS,
        worker=worker,
        lease_time=lease_time,
        renew_interval=interval,
        heartbeat_ttl=30,
        watchdog=300,
        loop=asyncio.get_running_loop(),
        on_renewed=lambda started, lost, workers: got.append(lost) if got is not None else None,
    )


def scheduler(q: RedisQueue, worker: str = "w") -> Scheduler:
    crawler = get_crawler()
    crawler._apply_settings()
    s = Scheduler(crawler, SchedulerConfig(worker_id=worker))
    s.session.queue = q
    return s


async def reclaim(q: RedisQueue, worker: str = "peer") -> int:
    result = await q.reclaim(
        worker=worker, interval_ms=1, batch=100, max_expiries=3, max_entries=100, max_age_ms=10**9
    )
    return result[0] if result else 0


async def leased_again(q: RedisQueue) -> tuple:
    """Lease the page for 1 ms, let a peer reclaim it, lease it again for good."""
    await q.sync(enqueue=[NewEntry(b"", 0, PAGE)])
    (a,) = (await q.sync(lease=1, lease_ms=1, promote=10)).leases
    await asyncio.sleep(0.05)
    assert await reclaim(q) == 1
    (b,) = (await q.sync(lease=1, lease_ms=30000, promote=10)).leases
    assert a.id == b.id and a.token != b.token
    return a, b


@deferred_f_from_coro_f
async def test_the_keeper_renews_the_leases_of_a_sync_the_loop_has_not_read(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    await q.sync(enqueue=[NewEntry(b"", 0, PAGE), NewEntry(b"", 0, PAGE + b" ")])
    k = keeper(redis_url, "w", lease_time=RENEWED_LEASE)
    k.syncing(True)  # the loop sent the sync and is blocked before it reads the reply
    synced = await q.sync(lease=2, lease_ms=int(RENEWED_LEASE * 1000), promote=10, worker="w")
    leases = synced.leases
    assert len(leases) == 2 and k._held == ()
    deadline = time.monotonic() + 2 * RENEWED_LEASE  # past the lease the sync gave
    while time.monotonic() < deadline:
        k.renew_once()
        await asyncio.sleep(0.05)
    assert await reclaim(q) == 0  # still leased to w: no peer takes them
    assert (await q.ack([(x.id, x.token) for x in leases])) == (2, 0)
    k.client.close()
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_lease_named_handed_that_redis_calls_stale_is_never_confirmed(redis_url):
    """The keeper's snapshots of what the worker holds and what it handed out are taken
    apart: a suspect announced (to run alone once Redis knows it was handed out) may be in
    the latter alone. Its lease stale, it is not said lost by this renewal (it may be a
    request Redis has not stored yet), and it must not be confirmed either: confirmed, the
    worker would run a request whose lease another worker holds."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    a, _ = await leased_again(q)  # a's lease taken over: stale
    got: list = []
    k = keeper(redis_url, "w", got=got)
    k.hand(((a.id, a.token),))  # named as handed, not held (yet)
    k.renew_once()
    assert (a.id, a.token) not in k.confirmed
    k.client.close()
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_lost_lease_drops_only_its_own_token(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    a, b = await leased_again(q)
    got: list = []
    k = keeper(redis_url, "w", got=got)
    k.hold(((a.id, a.token),))  # a snapshot taken before the re-lease
    k.renew_once()
    for _ in range(500):  # the result comes back with call_soon_threadsafe
        if got:
            break
        await asyncio.sleep(0.01)
    assert got == [[(a.id, a.token)]]
    s = scheduler(q)
    s.session.renewals.keeper = k
    request = Request("http://a.test/list1")
    request.meta[metakeys.LEASE] = (b.id, b.token)
    s._buffer.append(request)
    s.session.renewals._on_renewed(time.monotonic(), got[0], 1)
    assert list(s._buffer) == [request]  # the lease under token B is valid and kept
    assert s.stats.get_value("ha/leases_lost") is None
    k.client.close()
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_refused_child_is_enqueued_when_the_page_is_redone(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    s = scheduler(q)
    a, b = await leased_again(q)
    s.inflight.add(a.id, a.token, Request("http://a.test/list1"))  # the zombie's page, in flight
    child = Request("http://a.test/list2", meta={metakeys.PARENT: (a.id, a.token)})
    assert s.enqueue_request(child)
    await s.session._sync(lease=0)
    assert s.stats.get_value("ha/children_refused") == 1
    s.inflight.add(b.id, b.token, Request("http://a.test/list1"))  # the page, redone
    again = Request("http://a.test/list2", meta={metakeys.PARENT: (b.id, b.token)})
    assert s.enqueue_request(again)  # not a duplicate: the first was never stored
    await s.session._sync(lease=0)
    # stored: kept in the buffer of this worker (alone: scrapy_ha.scheduler.keep), leased to it
    assert [r.url for r in s._buffer] == ["http://a.test/list2"]
    assert (await q.counts()).leased == 2  # the page and its child
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_worker_that_left_is_not_re_registered_by_its_keeper(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    s = scheduler(q, "w")
    s.session.renewals.keeper = keeper(redis_url, "w", interval=0.02)
    s.session.renewals.keeper.start()
    deadline = time.monotonic() + 10
    while not await q.client.zscore(KEYS.workers, "w"):
        assert time.monotonic() < deadline, "the keeper never beat"
        await asyncio.sleep(0.02)
    await s.session._final_flush("finished")  # release, leave, finish (SCHEDULER_PERSIST=False)
    await asyncio.sleep(0.3)  # fifteen renewal intervals
    assert await q.client.zscore(KEYS.workers, "w") is None
    assert await q.client.exists(KEYS.workers) == 0
    k = keeper(redis_url, "late")
    k.stop()
    k.renew_once()  # a renewal that starts once stop is set does nothing
    assert await q.client.exists(KEYS.workers) == 0
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_new_leases_do_not_extend_older_buffered_ones(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    s = scheduler(q)
    old = Request("http://a.test/old")
    old.meta[metakeys.LEASE] = ("99", "x-1")  # buffered, its renewal long overdue
    s._buffer.append(old)
    await q.sync(enqueue=[NewEntry(b"", 0, PAGE)])
    await s.session._sync(lease=1)
    assert len(s._buffer) == 2
    assert s.session.renewals.valid_until == 0.0  # only a renewal vouches for the old lease
    fresh = scheduler(q, "v")
    await q.sync(enqueue=[NewEntry(b"", 0, PAGE)])
    await fresh.session._sync(lease=1)  # an empty buffer: every buffered lease is brand new
    assert fresh.session.renewals.valid_until > time.monotonic()
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_suspect_in_a_closed_domain_is_deferred_without_releasing_the_buffer(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    s = scheduler(q)
    suspect = Request("http://closed.test/1", meta={"_ha_suspect": 2})
    suspect.meta[metakeys.LEASE] = ("1", "t-1")
    other = Request("http://open.test/2")
    other.meta[metakeys.LEASE] = ("2", "t-2")
    s._buffer.append(suspect)
    s._buffer.append(other)
    s._target = lambda: 4
    s.closed.until = {"closed.test": time.monotonic() + 60}
    s.session.renewals.valid_until = time.monotonic() + 60
    assert s.next_request() is other
    assert [op.kind for op in s.outbox.ends] == ["defer"]
    assert s.outbox.releases == []  # the buffer was not given back for a suspect that waits
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_stale_deferral_is_not_counted_as_deferred(redis_url):
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    s = scheduler(q)
    a, b = await leased_again(q)
    from scrapy_ha.scheduler.outbox import EndOp

    await s.session.ends.end(EndOp("defer", a.id, a.token, Request("http://a.test/list1"), 5.0))
    assert s.stats.get_value("ha/deferred") is None
    assert s.stats.get_value("ha/stale_acks") == 1
    await q.client.aclose()


def test_a_lease_whose_end_is_under_way_is_not_reported_lost():
    """A renewal that ran after the script that ended a lease (an ack, a retry, a revisit)
    but whose reply reaches the loop before that script's does finds the lease gone: it was
    not lost, it ended."""
    s = scheduler(None)
    request = Request("http://a.test/page")
    s.outbox.ends.append(EndOp("revisit", "7", "t7", request, 60.0))
    s.outbox.acks.append(("8", "t8"))
    s.outbox.releases.append(("9", "t9"))
    s.drop_lost({("7", "t7"), ("8", "t8"), ("9", "t9")})
    assert s.stats.get_value("ha/leases_lost") is None
    s.drop_lost({("10", "t10")})
    assert s.stats.get_value("ha/leases_lost") == 1


@deferred_f_from_coro_f
async def test_a_sync_cut_short_leaves_its_grant_marked_unread(redis_url):
    """A sync that names the worker writes its grant (the leases it gives); the close reads
    the grant to release what such a sync leased if its reply was never read. Once a
    sync's reply is read and its leases taken, the grant names nothing the worker lacks,
    and the close skips that round trip."""
    q = RedisQueue(redis.asyncio.Redis.from_url(redis_url), KEYS)
    await q.sync(enqueue=[NewEntry(b"", 0, PAGE), NewEntry(b"", 0, PAGE + b" ")])
    s = scheduler(q)
    k = keeper(redis_url, "w")
    s.session.renewals.keeper = k
    syncer = s.session.syncer
    assert not syncer.grant_unread
    await syncer.sync(lease=1)
    assert len(s._buffer) == 1 and not syncer.grant_unread  # read, and its lease taken
    assert len(await q.granted("w")) == 1
    pauser = redis.asyncio.Redis.from_url(redis_url)
    await pauser.client_pause(10_000, all=False)  # writes wait: the sync's reply never comes
    cut = asyncio.ensure_future(syncer.sync(lease=1))
    for _ in range(500):
        if syncer.grant_unread:  # the call is made (its reply cannot come while paused)
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert not cut.done()
    cut.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await cut
    assert syncer.grant_unread
    await pauser.client_unpause()
    await pauser.aclose()
    k.client.close()
    await q.client.aclose()
