"""A worker's grant (the leases of its latest call that named it, see sync.lua) is read
only after a call whose reply was lost: the next call, or the close, releases the leases it
names that the worker never took, else they would wait out their lease. Real redis-server;
a reply lost for real (a TCP relay drops it after Redis ran the call,
``tests.test_resent_round``)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import pytest
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from scrapy import Request
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha import metakeys
from scrapy_ha.config.scheduler import SchedulerConfig
from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.shell import Scheduler
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.sharding import make_queue
from scrapy_ha.store.wire import NewEntry
from tests.test_keep import engine_busy
from tests.test_resent_round import dropping

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

KEYS = Keys("ha", "grant")
PAGE = b'{"v":1,"u":"http://a.test/list1"}'


@contextlib.asynccontextmanager
async def _worker(url: str) -> AsyncIterator[tuple[Scheduler, RedisQueue]]:
    """A scheduler on the queue at *url*, its lease keeper (a thread) running, as after
    its open; its client never sends a call again by itself (the round's own code does)."""
    client = redis.asyncio.Redis.from_url(url, retry=Retry(NoBackoff(), 0))
    queue = RedisQueue(client, KEYS)
    s = _scheduler(url, queue)
    try:
        yield s, queue
    finally:
        await s.session.renewals.stop_keeper(5)
        await client.aclose()


def _scheduler(url: str, queue: RedisQueue, order: str = "priority") -> Scheduler:
    """Worker "w"'s scheduler on *queue*, with its lease keeper running, as after its open."""
    crawler = get_crawler(settings_dict={"REDIS_URL": url})
    crawler._apply_settings()
    s = Scheduler(crawler, SchedulerConfig(worker_id="w", order=order))
    s.session.queue = s.session.ends.queue = queue
    s.session.renewals.start_keeper(queue)
    return s


@contextlib.asynccontextmanager
async def _crawl(redis_url: str, pages: int = 1, order: str = "fifo") -> AsyncIterator[Any]:
    """A client of the crawl's Redis, *pages* pending in it; flushed after."""
    direct = redis.asyncio.Redis.from_url(redis_url)
    entries = [NewEntry(b"", 0, PAGE + b" " * n) for n in range(pages)]
    await RedisQueue(direct, KEYS, order=order).sync(enqueue=entries)
    try:
        yield direct
    finally:
        await direct.flushdb()
        await direct.aclose()


async def _state(client: Any) -> tuple[int, int]:
    """Leases held, and requests pending, in the crawl."""
    leased = await client.zcard(KEYS.leased)
    counts = await RedisQueue(client, KEYS).counts()
    return leased, counts.pending


@deferred_f_from_coro_f
async def test_the_round_after_a_lost_reply_gives_its_leases_back_first_even_paused(redis_url):
    """The reply of a leasing round is lost; the operator pauses the crawl (the next round
    leases nothing and leaves the grant as it was): that round reads the grant first and
    gives the lease back, pending at once, and the close reads nothing more."""
    async with _crawl(redis_url) as direct:
        async with dropping(redis_url, KEYS.grant("w").encode()) as relay:
            async with _worker(relay.url) as (s, queue):
                syncer = s.session.syncer
                with pytest.raises(redis.exceptions.ConnectionError):
                    await syncer.sync(lease=1)  # Redis leased the page; the reply never came
                assert relay.dropped == 1 and syncer.grant_unread
                assert await _state(direct) == (1, 0) and not s._buffer
                await direct.set(KEYS.paused, 1)  # scrapy-ha pause
                await syncer.sync(lease=1)  # leases nothing, after giving the page back
                assert await _state(direct) == (0, 1)
                assert s.stats.get_value("ha/released") == 1 and not syncer.grant_unread
                await s.session._final_flush("shutdown")
                assert s.stats.get_value("ha/released") == 1
        assert await _state(direct) == (0, 1)


@deferred_f_from_coro_f
async def test_a_later_round_does_not_leave_a_lost_rounds_leases_to_expire(redis_url):
    """The next call that names the worker writes its grant anew (here a leasing round on a
    drained queue): the lost round's lease is given back before it, not left to expire."""
    async with _crawl(redis_url) as direct:
        async with dropping(redis_url, KEYS.grant("w").encode()) as relay:
            async with _worker(relay.url) as (s, queue):
                with pytest.raises(redis.exceptions.ConnectionError):
                    await s.session.syncer.sync(lease=1)
                await direct.set(KEYS.paused, 1)  # the page given back stays pending
                await s.session.syncer.sync(lease=1)
                await direct.delete(KEYS.paused)
                assert await _state(direct) == (0, 1)
                await s.session.syncer.sync(lease=1)  # takes the page again: its own lease
                assert len(s._buffer) == 1 and await _state(direct) == (1, 0)
                await s.session._final_flush("shutdown")
        assert await _state(direct) == (0, 1)


@deferred_f_from_coro_f
async def test_a_lost_rounds_request_in_flight_is_not_given_back(redis_url):
    """The lost round stored a new request the worker had handed to its engine already (its
    lease is in the grant, and the worker never learnt it was stored): the next round gives
    back the page the lost round leased, not that request, which is being downloaded."""
    async with _crawl(redis_url) as direct:
        async with dropping(redis_url, KEYS.grant("w").encode()) as relay:
            async with _worker(relay.url) as (s, queue):
                s.session.redis_ok = True  # connected: new requests may go out before the round
                s._slots.free = lambda crawler, request: True  # noqa: ARG005
                assert s.enqueue_request(Request("http://a.test/new"))
                handed = s.next_request()  # to the engine before Redis has it
                assert handed is not None and handed.url == "http://a.test/new"
                with pytest.raises(redis.exceptions.ConnectionError):
                    await s.session.syncer.sync(lease=1)  # the page leased, the request stored
                assert len(await RedisQueue(direct, KEYS).granted("w")) == 2
                await s.session.syncer.sync(lease=0)
                assert s.stats.get_value("ha/released") == 1  # the page alone
                assert await _state(direct) == (1, 1)  # the request in flight keeps its lease
                assert handed.meta[metakeys.LEASE] in s.local_leases()  # stored now
                s.inflight.clear()


@deferred_f_from_coro_f
async def test_after_a_round_read_whole_the_close_does_not_read_the_grant(redis_url, redis_writes):
    async with _crawl(redis_url) as direct:
        async with _worker(redis_url) as (s, _):
            syncer = s.session.syncer
            await syncer.sync(lease=1)
            assert len(s._buffer) == 1 and not syncer.grant_unread
            redis_writes.clear()
            await s.session._final_flush("shutdown")
            assert s.stats.get_value("ha/released") == 1  # the buffered lease, given back
            assert not [w for w in redis_writes if b":grant:w" in b"".join(w)]
        assert await _state(direct) == (0, 1)


@deferred_f_from_coro_f
async def test_after_a_round_that_leased_nothing_the_close_does_not_read_the_grant(
    redis_url, redis_writes
):
    async with _crawl(redis_url, 0), _worker(redis_url) as (s, _):
        await s.session.syncer.sync(lease=1)  # a drained queue: the grant written empty
        assert not s._buffer and not s.session.syncer.grant_unread
        redis_writes.clear()
        await s.session._final_flush("shutdown")
        assert redis_writes  # the close's own calls were seen
        assert not [w for w in redis_writes if b":grant:w" in b"".join(w)]


@deferred_f_from_coro_f
async def test_a_sharded_crawls_close_always_reads_the_grants(redis_url):
    """A sharded crawl's round calls only the shards it needs: a grant an older round wrote
    in another shard stays, so no round read whole says there is nothing to read."""
    client = redis.asyncio.Redis.from_url(redis_url)
    queue = make_queue(client, "ha", "grant", 2, worker="w")
    for shard in queue.shards:
        await shard.sync(enqueue=[NewEntry(b"", 0, PAGE), NewEntry(b"", 0, PAGE + b" ")])
    s = _scheduler(redis_url, queue)
    try:
        await s.session.syncer.sync(lease=1)
        assert len(s._buffer) == 1
        assert s.session.syncer.grant_unread
    finally:
        await s.session.renewals.stop_keeper(5)
        await client.flushdb()
        await client.aclose()


@deferred_f_from_coro_f
async def test_a_round_cut_short_with_a_kept_child_leaves_its_leases_to_the_close(redis_url):
    """The lost round leased a page and stored a new request kept in the worker's buffer.
    The close sends that request again, and the call names the worker (it holds a kept
    request): sync.lua writes the grant anew with that request alone. The close reads the
    grant before that, so the page the lost round leased is given back too, pending at once,
    not left to wait out its lease."""
    async with _crawl(redis_url, order="lifo") as direct:
        async with dropping(redis_url, KEYS.grant("w").encode()) as relay:
            client = redis.asyncio.Redis.from_url(relay.url, retry=Retry(NoBackoff(), 0))
            queue = RedisQueue(client, KEYS, order="lifo")
            s = _scheduler(relay.url, queue, order="lifo")
            try:
                engine_busy(s)  # the new request waits for the round, which keeps it
                assert s.enqueue_request(Request("http://a.test/new"))
                with pytest.raises(redis.exceptions.ConnectionError):
                    await s.session.syncer.sync(lease=1)  # the page leased, the request stored
                assert relay.dropped == 1 and s.session.syncer.grant_unread
                assert [e.kept for e in s.outbox.children] == [True]  # sent again at close
                assert len(await RedisQueue(direct, KEYS).granted("w")) == 2
                await s.session._final_flush("shutdown")
            finally:
                await s.session.renewals.stop_keeper(5)
                await client.aclose()
        # the kept request (never downloaded here) and the page: both pending, none leased
        assert await _state(direct) == (0, 2)


@deferred_f_from_coro_f
async def test_another_process_of_the_same_worker_id_keeps_its_lease(redis_url):
    """Two processes given the same HA_WORKER_ID write the same grant key: after its lost
    reply, worker A finds B's lease in the grant, and leaves it (only the leases whose
    token the lost call made are given back)."""
    async with _crawl(redis_url, 2) as direct:
        async with dropping(redis_url, KEYS.grant("w").encode()) as relay:
            async with _worker(relay.url) as (a, _), _worker(redis_url) as (b, _):
                with pytest.raises(redis.exceptions.ConnectionError):
                    await a.session.syncer.sync(lease=1)  # A's lease, its reply lost
                await b.session.syncer.sync(lease=1)  # B's: the grant names it alone now
                assert len(b._buffer) == 1 and await _state(direct) == (2, 0)
                await a.session.syncer.sync(lease=0)
                assert await _state(direct) == (2, 0)  # B's lease still B's
                assert not a.session.syncer.grant_unread


@deferred_f_from_coro_f
async def test_a_grant_that_is_not_a_hash_does_not_stop_the_worker(redis_url, caplog):
    async with _crawl(redis_url) as direct:
        async with _worker(redis_url) as (s, _):
            await direct.set(KEYS.grant("w"), "garbage")
            s.session.syncer.grant_unread = True  # as after a lost reply
            await s.session.syncer.sync(lease=1)  # sync.lua writes the grant anew
            assert len(s._buffer) == 1 and not s.session.syncer.grant_unread
            assert await direct.type(KEYS.grant("w")) == b"hash"
        assert "The lease grant of worker w is not a hash" in caplog.text
