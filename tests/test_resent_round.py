"""A sync round whose reply is lost (the connection drops after Redis ran the script) is
sent again whole: nothing it enqueued is stored or counted twice.

The reply is lost for real: a TCP relay in front of a real redis-server passes the script
call through and drops the connection instead of passing its reply back."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import pytest
import redis
import redis.asyncio
import scrapy
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError
from scrapy.core.engine import ExecutionEngine
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import NewEntry
from tests import backqueues

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

#: Copies of one page a callback yields with dont_filter: more than a worker hands out from
#: memory before its next round, so that most of them go to Redis pending.
COPIES = 30


class ReplyDropper:
    """Relays Redis connections; once armed, the first command that carries *marker* goes
    to Redis, and its reply is dropped with the connection (the client sees a reset)."""

    def __init__(self, redis_url: str, marker: bytes) -> None:
        parsed = redis.connection.parse_url(redis_url)
        self.target = (parsed.get("host", "127.0.0.1"), int(parsed.get("port", 6379)))
        self.db = int(parsed.get("db", 0))
        self.marker = marker
        self.armed = True
        self.dropped = 0
        self.server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        port = self.server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}/{self.db}"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()

    async def _relay(self, client_r: Any, client_w: Any) -> None:
        server_r, server_w = await asyncio.open_connection(*self.target)
        drop = asyncio.Event()
        writers = (client_w, server_w)
        await asyncio.gather(
            self._pump(client_r, server_w, writers, arm=drop),
            self._pump(server_r, client_w, writers, drop=drop),
            return_exceptions=True,
        )

    async def _pump(
        self,
        reader: Any,
        writer: Any,
        writers: tuple[Any, Any],
        *,
        arm: asyncio.Event | None = None,
        drop: asyncio.Event | None = None,
    ) -> None:
        try:
            while data := await reader.read(65536):
                if arm is not None and self.armed and self.marker in data:
                    self.armed = False
                    arm.set()
                if drop is not None and drop.is_set():
                    self.dropped += 1  # Redis ran the call: its reply never arrives
                    break
                writer.write(data)
                await writer.drain()
        finally:
            for w in writers:
                w.close()


@contextlib.asynccontextmanager
async def dropping(redis_url: str, marker: bytes) -> AsyncIterator[ReplyDropper]:
    relay = ReplyDropper(redis_url, marker)
    await relay.start()
    try:
        yield relay
    finally:
        await relay.stop()


@deferred_f_from_coro_f
async def test_a_round_sent_again_after_its_reply_was_lost_counts_once(redis_url):
    """The worker sends the same round again (its outbox keeps what Redis did not
    confirm): the never-filtered child is pending once, a start request is not reported
    as already in the crawl, and the crawl-wide counters count each request once."""
    keys = Keys("ha", "s")
    direct = RedisQueue(redis.asyncio.Redis.from_url(redis_url), keys)
    try:
        await _lose_a_reply_then_resend(direct, redis_url)
    finally:
        await direct.client.aclose()


async def _lose_a_reply_then_resend(direct: RedisQueue, redis_url: str) -> None:
    keys = direct.keys
    await direct.enqueue([NewEntry(b"fp-page", 0, b"page")])
    (page,) = await direct.lease(1, 30000)
    child = NewEntry(b"", 0, b"dont-filter-child", parent=(page.id, page.token))
    root = NewEntry(b"fp-root", 0, b"new-root")
    async with dropping(redis_url, b"dont-filter-child") as relay:
        q = RedisQueue(redis.asyncio.Redis.from_url(relay.url), keys)
        call = {"enqueue": [child, root], "ack": [(page.id, page.token)]}
        try:
            with contextlib.suppress(redis.exceptions.ConnectionError):  # or redis-py resent it
                await q.sync(**call, sender=("c0ffee", 1))
            assert relay.dropped == 1
            result = await q.sync(**call, sender=("c0ffee", 1))  # the same round, sent again
        finally:
            await q.client.aclose()
    assert (result.added, result.roots_seen, result.refused) == (2, 0, 0)
    assert (result.acked, result.stale) == (0, 1)  # the lost call acked it
    pending = await backqueues.pending_async(direct.client, keys)
    assert sorted(payload for _, payload in pending) == [b"dont-filter-child", b"new-root"]
    stats = await direct.client.hgetall(keys.stats)
    assert stats.get(b"enqueued") == b"3"  # page, child, root: each once
    assert b"filtered" not in stats
    # the next round of the same worker goes on from there
    more = NewEntry(b"", 0, b"next-child")
    after = await direct.sync(enqueue=[child, more], sender=("c0ffee", 2))
    assert after.added == 2
    assert len(await backqueues.pending_async(direct.client, keys)) == 3


class CopiesSpider(scrapy.Spider):
    """One page that yields COPIES never-filtered copies of one item page."""

    name = "copies"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/list/1"]

    def parse(self, response: Any) -> Any:
        for k in range(COPIES):
            yield response.follow(f"/item/1?copy={k}", self.parse_item, dont_filter=True)

    def parse_item(self, response: Any) -> Any:
        yield {"url": response.url}


@pytest.fixture
def fast_engine_heartbeat(monkeypatch):
    monkeypatch.setattr(ExecutionEngine, "_SLOT_HEARTBEAT_INTERVAL", 0.2)


@deferred_f_from_coro_f
async def test_a_crawl_whose_round_reply_is_lost_crawls_each_copy_once(
    redis_url, site, fast_engine_heartbeat
):
    """A real crawl: the reply of the round that sends the copies is lost; the worker
    reconnects and sends the round again; each copy is downloaded once."""
    async with dropping(redis_url, b"copy=") as relay:
        settings = {
            "SCHEDULER": "scrapy_ha.Scheduler",
            "REDIS_URL": relay.url,
            "HA_IDLE_TIMEOUT": 1.0,
            "CONCURRENT_REQUESTS": 1,
            "HA_LEASE_TIME": 3,  # the lost call's leases come back soon
            "HA_LEASE_RENEW_INTERVAL": 1,
            "HA_RECLAIM_INTERVAL": 0.5,
            "CLOSESPIDER_TIMEOUT": 60,
        }
        crawler = get_crawler(CopiesSpider, settings)
        await crawler.crawl_async(base_url=site.url)
    assert relay.dropped == 1
    hits = site.hits()
    copies = {k: v for k, v in hits.items() if "copy=" in k}
    assert len(copies) == COPIES
    assert set(copies.values()) == {1}, copies
    assert crawler.stats.get_value("finish_reason") == "finished"
    stats = redis.Redis.from_url(redis_url).hgetall(Keys("ha", "copies").stats)
    assert stats[b"enqueued"] == str(COPIES + 1).encode()


async def _leased_and_pending(client: Any, keys: Keys) -> tuple[int, int]:
    counts = await RedisQueue(client, keys).counts()
    return await client.zcard(keys.leased), counts.pending


@deferred_f_from_coro_f
async def test_a_leasing_call_run_twice_gives_its_leases_once(redis_url):
    """The same call run again (the client resent it, its first reply lost): the leases the
    first run gave go back first and are given again, so Redis holds only the leases of the
    reply the worker reads; a later call of the worker (another nonce) gives back none."""
    keys = Keys("ha", "twice")
    client = redis.asyncio.Redis.from_url(redis_url)
    q = RedisQueue(client, keys)
    try:
        await q.sync(enqueue=[NewEntry(b"", 0, b"page-%d" % i) for i in range(4)])
        first = await q.sync(lease=2, worker="w", nonce="a1b2c3")
        second = await q.sync(lease=2, worker="w", nonce="a1b2c3")
        assert [lease.id for lease in second.leases] == [lease.id for lease in first.leases]
        assert second.released == 2
        assert await _leased_and_pending(client, keys) == (2, 2)
        grant = await client.hgetall(keys.grant("w"))
        pairs = {lease.id.encode(): lease.token.encode() for lease in second.leases}
        assert grant == {**pairs, b"=": b"a1b2c3"}
        assert await q.granted("w") == pairs
        third = await q.sync(lease=1, worker="w", nonce="d4e5f6")
        assert (len(third.leases), third.released) == (1, 0)
        assert await _leased_and_pending(client, keys) == (3, 1)
    finally:
        await client.flushdb()
        await client.aclose()


@deferred_f_from_coro_f
async def test_a_leasing_call_redis_py_resends_leaves_no_lease_unseen(redis_url):
    """A client that resends a command after a connection error (the Redis Cluster
    client does; a plain one given ``retry_on_error`` in ``REDIS_PARAMS``): the worker
    reads the second run's reply only, and Redis holds those leases only; before, the
    first run's waited out their lease."""
    keys = Keys("ha", "resent")
    direct = redis.asyncio.Redis.from_url(redis_url)
    try:
        pages = [NewEntry(b"", 0, b"p0"), NewEntry(b"", 0, b"p1")]
        await RedisQueue(direct, keys).sync(enqueue=pages)
        async with dropping(redis_url, b"grant:w") as relay:
            client = redis.asyncio.Redis.from_url(
                relay.url, retry=Retry(NoBackoff(), 1), retry_on_error=[ConnectionError]
            )
            try:
                result = await RedisQueue(client, keys).sync(lease=1, worker="w")
            finally:
                await client.aclose()
        assert relay.dropped == 1
        assert len(result.leases) == 1
        assert await _leased_and_pending(direct, keys) == (1, 1)
    finally:
        await direct.flushdb()
        await direct.aclose()


@deferred_f_from_coro_f
async def test_a_call_run_again_while_the_crawl_is_paused_gives_back_and_leases_nothing(
    redis_url,
):
    """The crawl paused between the two runs: the run again leases nothing and gives the
    first run's leases back (its keys checked as for a lease: a wrong type refuses it
    before any write)."""
    keys = Keys("ha", "paused")
    client = redis.asyncio.Redis.from_url(redis_url)
    q = RedisQueue(client, keys)
    try:
        await q.sync(enqueue=[NewEntry(b"", 0, b"page-%d" % i) for i in range(2)])
        await q.sync(lease=2, worker="w", nonce="a1b2c3")
        await client.set(keys.paused, "1")
        await client.set(keys.polite, "garbage")
        with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
            await q.sync(lease=2, worker="w", nonce="a1b2c3")
        assert await _leased_and_pending(client, keys) == (2, 0)
        await client.delete(keys.polite)
        second = await q.sync(lease=2, worker="w", nonce="a1b2c3")
        assert (second.leases, second.released) == ([], 2)
        assert await _leased_and_pending(client, keys) == (0, 2)
    finally:
        await client.flushdb()
        await client.aclose()


@deferred_f_from_coro_f
async def test_loose_items_sent_again_after_a_lost_reply_are_added_once(redis_url):
    """Items start() yields go to the stream on their own, numbered under the worker's
    nonce: the same call sent again after its reply was lost adds none twice (before, the
    stream held the item twice)."""
    from scrapy_ha.store.items import ItemStream

    keys = Keys("ha", "loose")
    direct = redis.asyncio.Redis.from_url(redis_url)
    try:
        assert await ItemStream(direct, keys).add([b'{"n": 0}'], ("c0ffee", 1)) == 1  # loaded
        async with dropping(redis_url, b"start-item") as relay:
            client = redis.asyncio.Redis.from_url(relay.url)
            try:
                with contextlib.suppress(redis.exceptions.ConnectionError):
                    await ItemStream(client, keys).add([b'{"n": "start-item"}'], ("c0ffee", 2))
            finally:
                await client.aclose()
        assert relay.dropped == 1
        assert await ItemStream(direct, keys).add([b'{"n": "start-item"}'], ("c0ffee", 2)) == 1
        assert await direct.xlen(keys.items) == 2
        assert await direct.hget(keys.stats, "items") == b"2"
        assert await ItemStream(direct, keys).add([b'{"n": 3}'], ("c0ffee", 3)) == 1
        assert await direct.xlen(keys.items) == 3
    finally:
        await direct.flushdb()
        await direct.aclose()
