"""What the scripts keep for the operator's tools, against a real redis-server: why a delayed
entry waits without an attempt (a closed gate, its domain's limits), retries and dead letters
per minute by class, what operators did per minute, and the workers seen in a window."""

from __future__ import annotations

import redis
import redis.asyncio
from scrapy.core.engine import ExecutionEngine
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.cli.report import build_report
from scrapy_ha.config.politeness import DomainLimit, Politeness
from scrapy_ha.keys import Keys
from scrapy_ha.ops.stats import read_crawl_stats
from scrapy_ha.ops.waiting import read_waiting
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.state import set_domain_limits
from tests.spiders import CatalogueSpider
from tests.test_politeness_scripts import page
from tests.test_retry_crawl import FAST_RETRIES
from tests.test_stats_counters import lease_all, minute_of, request

KEYS = Keys("ha", "ops")


def open_queue(url: str) -> RedisQueue:
    return RedisQueue(redis.asyncio.Redis.from_url(url), KEYS)


def held(client: redis.Redis) -> dict[str, str]:
    """The marks of ``held`` (checked against its counts: one per mark)."""
    found = {k.decode(): v.decode() for k, v in client.hgetall(KEYS.held).items()}
    marks = {k: v for k, v in found.items() if not k.startswith("#")}
    counts = {k[1:]: int(v) for k, v in found.items() if k.startswith("#")}
    assert counts == {m: list(marks.values()).count(m) for m in set(marks.values())}
    return marks


@deferred_f_from_coro_f
async def test_a_deferral_is_marked_as_waiting_for_its_gate_and_a_retry_is_not(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([request("http://a.example/1"), request("http://b.example/2")])
    leased = await lease_all(q)
    gated, retried = leased["http://a.example/1"], leased["http://b.example/2"]
    assert await q.retry_later(*gated, 60_000, b"")  # a closed gate: no attempt
    assert await q.retry_later(*retried, 60_000, b"", failure_class="server")
    client = redis.Redis.from_url(redis_url)
    assert held(client) == {gated[0]: "gate a.example"}
    # made due (retry-now), promoted by a worker's sync: the mark goes with the wait
    await q.client.zadd(KEYS.delayed, {gated[0]: 0, retried[0]: 0})
    assert len(await q.lease(10, 30_000)) == 2
    assert held(client) == {}
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_requests_held_back_by_their_domains_limit_are_counted_so(redis_url):
    q = open_queue(redis_url)
    await set_domain_limits(q.client, KEYS, Politeness(DomainLimit(concurrency=1), {}).as_hash())
    await q.enqueue([page("a.test", n) for n in range(3)])
    await q.enqueue([page("b.test", n) for n in range(2)])
    await q.close_gate("b.test", 600_000)
    (first,) = await q.lease(5, 30_000)  # one slot: a.test's other two wait in its queue
    client = redis.Redis.from_url(redis_url)
    assert held(client) == {}  # no delayed entry: they wait in their hosts' back queues
    waiting = await read_waiting(q.client, [KEYS])
    assert waiting.held == {"limit": {"a.test": 2}, "gate": {"b.test": 2}}
    assert (waiting.retries, waiting.held_total) == (0, 0)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_retries_dead_letters_and_operators_are_counted_per_minute_and_class(redis_url):
    q = open_queue(redis_url)
    urls = [f"http://a.example/{i}" for i in range(4)]
    await q.enqueue([request(u) for u in urls])
    x = await lease_all(q)
    await q.retry_later(*x[urls[0]], 60_000, b"", failure_class="server")
    await q.retry_later(*x[urls[1]], 60_000, b"", failure_class="timeout")
    await q.dead_letter(*x[urls[2]], {"class": "gone", "reason": "HTTP 404"})
    await q.dead_letter(*x[urls[3]], {"class": "gone", "reason": "HTTP 404"})
    (one, _two) = [m.decode() for m in await q.client.zrange(KEYS.dead, 0, -1)]
    assert await q.requeue_dead([(one, 0, b'{"v":1,"u":"http://a.example/2"}')]) == 1
    client = redis.Redis.from_url(redis_url)
    minute = minute_of(client)
    s = read_crawl_stats(client, KEYS)
    for name, n in {
        "retried:server": 1,
        "retried:timeout": 1,
        "dead:gone": 2,
        "retried": 2,
        "dead": 2,
        "requeued": 1,
    }.items():
        assert sum(s.minutes[name].values()) == n, name
        assert set(s.minutes[name]) <= {minute - 1, minute}, name
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_the_report_names_the_workers_of_its_window_after_they_left(redis_url, monkeypatch):
    monkeypatch.setattr(ExecutionEngine, "_SLOT_HEARTBEAT_INTERVAL", 0.2)
    for _ in range(2):  # two workers, one after the other: both gone when the report runs
        crawler = get_crawler(CatalogueSpider, {**FAST_RETRIES, "REDIS_URL": redis_url})
        await crawler.crawl_async(base_url="http://127.0.0.1:9/")  # nothing answers: quick
    client = redis.asyncio.Redis.from_url(redis_url)
    queue = RedisQueue(client, Keys("ha", "catalogue"))
    assert await client.zcard(queue.keys.workers) == 0  # both left the live set
    report = await build_report(queue, 3600)
    assert len(report.workers_seen) == 2, report.workers_seen
    assert all(w.count(":") >= 2 for w in report.workers_seen)  # host:pid:...
    assert set(report.workers_last_seen) == set(report.workers_seen)
    await client.zadd(queue.keys.seen, {report.workers_seen[0]: 1_000})  # long ago
    assert (await build_report(queue, 3600)).workers_seen == report.workers_seen[1:]
    await client.aclose()
