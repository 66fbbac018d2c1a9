"""Defects a review of the merged round found, each against a real redis-server: a zombie
copy's children fenced again, a sharded finish that waits for every live worker, and the
start URLs of a sharded crawl fed once when two workers read the same head."""

from __future__ import annotations

import time

from scrapy import Request, Spider
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha import metakeys
from scrapy_ha.scheduler.inflight import InFlight
from scrapy_ha.scheduler.outbox import Outbox
from scrapy_ha.scheduler.session.start_urls import peek_start_urls
from scrapy_ha.store.wire import NewEntry
from tests.test_shards import entry, lease_all, sharded


def test_a_zombie_copys_child_is_fenced_by_its_old_lease_when_the_page_was_leased_again():
    """The worker's copy of page E stalled past its lease, which was reclaimed; the worker
    then leased E again (token t2). A child of the old copy names (E, t1): it must stay
    fenced by (E, t1), which Redis refuses, not be queued as a new request."""
    crawler = get_crawler(Spider)
    crawler.stats.open_spider()
    inflight = InFlight(crawler, Outbox())
    inflight.add("E", "t2", Request("http://a.test/page"))
    child = Request("http://a.test/child", meta={metakeys.PARENT: ("E", "t1")})
    kin = inflight.kin(child)
    assert kin.fence == ("E", "t1") and not kin.late
    late = Request("http://a.test/late", meta={metakeys.PARENT: ("F", "t9")})  # F finished
    kin = inflight.kin(late)
    assert kin.fence is None and kin.late


@deferred_f_from_coro_f
async def test_a_sharded_finish_waits_while_another_worker_lives(redis_url):
    """Every worker heartbeats in shard 0; the other shards' scripts cannot see them. A
    worker that finished used to clear shards 1..N-1 (their dupefilters too) while another
    was still alive, which then crawled again every URL whose fingerprint lived there."""
    q = sharded(redis_url, shards=3, worker="a")
    await q.sync(enqueue=[entry(f"u{i}") for i in range(12)])
    leases = await lease_all(q)
    await q.sync(ack=[(x.id, x.token) for x in leases])
    home = q.shards[0]
    await home.client.zadd(home.keys.workers, {"b": int(time.time() * 1000) + 60_000})
    assert not await q.finish("a")
    assert all([await s.client.scard(s.keys.dupefilter) for s in q.shards])
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_start_urls_read_by_two_workers_are_fed_once(redis_url):
    """Start requests are never deduplicated: two workers that read the same head of the
    list both enqueued it before one of them took it out (crawled twice)."""
    a, b = sharded(redis_url, shards=3, worker="a"), sharded(redis_url, shards=3, worker="b")
    raw = [f"https://example.com/{i}".encode() for i in range(6)]
    await a.client.rpush("s:start_urls", *raw)
    peek_a = await peek_start_urls(a.client, "s:start_urls", as_set=False, batch=10)
    peek_b = await peek_start_urls(b.client, "s:start_urls", as_set=False, batch=10)

    def entries(peeked: list[bytes]) -> list[NewEntry]:
        return [NewEntry(b"", 0, b"payload-" + u) for u in peeked]  # dont_filter

    assert await a.feed("s:start_urls", as_set=False, raw=peek_a, entries=entries(peek_a)) == 6
    assert await b.feed("s:start_urls", as_set=False, raw=peek_b, entries=entries(peek_b)) == -1
    assert (await a.counts()).pending == 6
    await a.client.set(a._home.keys.feed_guard, "1")  # another worker is feeding now
    await a.client.rpush("s:start_urls", b"https://example.com/late")
    late = await peek_start_urls(b.client, "s:start_urls", as_set=False, batch=10)
    assert await b.feed("s:start_urls", as_set=False, raw=late, entries=entries(late)) == -1
    assert (await a.counts()).pending == 6
    await a.client.aclose()
    await b.client.aclose()
