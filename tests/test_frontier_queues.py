"""The back queues (one per host and priority, lua/lib/frontier.lua) against a real
redis-server: Scrapy's order within and across hosts, a gated or limited host that waits
without its requests being read, requests that come back in their place, the host read
the same by the worker and the scripts, and a queue key of another type set aside."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis.asyncio
from scrapy import Request
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.config.politeness import DomainLimit, Politeness
from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.domains import ClosedDomains
from scrapy_ha.store import scripts
from scrapy_ha.store.hosts import payload_host, url_host
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.state import set_domain_limits
from scrapy_ha.store.wire import NewEntry

KEYS = Keys("ha", "fq")
#: Seconds a poll of these tests waits before it fails (a shared, slow machine).
DEADLINE = 30.0


def page(host: str, n: int, priority: int = 0) -> NewEntry:
    """A request as the codec stores it, with the host a worker sends."""
    payload = b'{"v":1,"u":"http://%s/%d"}' % (host.encode(), n)
    return NewEntry(b"%s/%d" % (host.encode(), n), priority, payload, host=host)


def name(payload: bytes) -> str:
    """``host/n`` of a payload of :func:`page`."""
    return payload.split(b"//", 1)[1].split(b'"', 1)[0].decode()


def open_queue(url: str, order: str = "fifo", start_order: str = "") -> RedisQueue:
    return RedisQueue(redis.asyncio.Redis.from_url(url), KEYS, order=order, start_order=start_order)


async def lease_one_by_one(q: RedisQueue, n: int) -> list[str]:
    """Lease *n* requests one call at a time (each call sees the whole order anew)."""
    got = []
    for _ in range(n):
        got += [name(lease.payload) for lease in await q.lease(1, 30000)]
    return got


@pytest.mark.parametrize(("order", "first", "second"), [("fifo", 1, 2), ("lifo", 2, 1)])
@deferred_f_from_coro_f
async def test_scrapys_order_holds_within_and_across_hosts(redis_url, order, first, second):
    q = open_queue(redis_url, order)
    # arrival: a/1 b/1 c/1 (priority 0), a/9 at priority 5, then a/2 b/2 c/2, then c/9 at -1
    await q.enqueue([page("a", 1), page("b", 1), page("c", 1), page("a", 9, 5)])
    await q.enqueue([page("a", 2), page("b", 2), page("c", 2), page("c", 9, -1)])
    same = [f"a/{first}", f"b/{first}", f"c/{first}", f"a/{second}", f"b/{second}"]
    same += [f"c/{second}"]
    if order == "lifo":  # the newest first: the second batch, newest to oldest, then the first
        same = ["c/2", "b/2", "a/2", "c/1", "b/1", "a/1"]
    expected = ["a/9", *same, "c/9"]
    assert await lease_one_by_one(q, 8) == expected
    await q.flush()
    await q.enqueue([page("a", 1), page("b", 1), page("c", 1), page("a", 9, 5)])
    await q.enqueue([page("a", 2), page("b", 2), page("c", 2), page("c", 9, -1)])
    # one call for all of them: the same order (the heads of the best queues, merged)
    assert [name(lease.payload) for lease in await q.lease(10, 30000)] == expected
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_gated_host_waits_and_none_of_its_requests_is_read(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([page("gated.test", n) for n in range(500)])
    await q.enqueue([page("free.test", n) for n in range(5)])
    await q.close_gate("gated.test", 600)
    first = await q.sync(lease=10)
    # the gate is kept in Redis: the gated host's requests stay where they are, waiting
    assert sorted(name(lease.payload) for lease in first.leases) == [
        f"free.test/{n}" for n in range(5)
    ]
    assert first.pending == 500 and first.delayed == 0
    waiting = await q.client.zrange(KEYS.waiting, 0, -1, withscores=True)
    assert [(qid, int(score)) for qid, score in waiting] == [
        (b"0:gated.test", first.gates["gated.test"])
    ]
    assert await q.client.llen(KEYS.queue("0:gated.test")) == 500
    assert (await q.sync(lease=10)).leases == []  # still gated: nothing, and nothing read
    deadline = time.monotonic() + DEADLINE
    while not (again := await q.lease(10, 30000)):
        assert time.monotonic() < deadline, "the gated host never came back"
        await asyncio.sleep(0.05)
    assert [name(lease.payload) for lease in again] == [f"gated.test/{n}" for n in range(10)]
    await q.client.aclose()


@pytest.mark.parametrize("url", ["http://[::1]:8080/a", "http://Example.COM:81/a"])
@deferred_f_from_coro_f
async def test_a_gate_the_worker_closes_holds_its_hosts_back_queue(redis_url, url):
    """The worker names a gate by the host its back queue has. Before, an IPv6 host was
    gated as '::1' (urlparse's hostname) and queued as '[::1]': never held back."""
    gate = ClosedDomains().close(Request(url), 60)
    assert gate == url_host(url)
    q = open_queue(redis_url)
    await q.enqueue([page(url_host(url), n) for n in range(3)])
    await q.close_gate(gate, 60000)
    assert (await q.sync(lease=10)).leases == []
    assert await q.client.zrange(KEYS.waiting, 0, -1) == [f"0:{gate}".encode()]
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_host_at_its_concurrency_limit_waits_until_one_of_its_leases_ends(redis_url):
    q = open_queue(redis_url)
    limits = Politeness(DomainLimit(), {"a.test": DomainLimit(concurrency=1)})
    await set_domain_limits(q.client, KEYS, limits.as_hash())
    await q.enqueue([page("a.test", n) for n in range(3)] + [page("b.test", n) for n in range(3)])
    leases = await q.lease(10, 30000)
    assert sorted(name(lease.payload) for lease in leases) == [
        "a.test/0",
        "b.test/0",
        "b.test/1",
        "b.test/2",
    ]
    assert await q.client.zrange(KEYS.waiting, 0, -1) == [b"0:a.test"]
    assert await q.lease(10, 30000) == []  # its slot is held: it waits
    held = next(lease for lease in leases if name(lease.payload) == "a.test/0")
    assert await q.ack([(held.id, held.token)]) == (1, 0)
    # the end of its lease woke it at once (not after a wait)
    assert await q.client.zrange(KEYS.waiting, 0, -1) == []
    assert [name(lease.payload) for lease in await q.lease(10, 30000)] == ["a.test/1"]
    stats = await q.client.hgetall(KEYS.stats)
    assert int(stats[b"domain_limited"]) >= 2  # each time its queue was set to wait
    await q.client.aclose()


@pytest.mark.parametrize("order", ["fifo", "lifo"])
@deferred_f_from_coro_f
async def test_requests_that_come_back_keep_their_place(redis_url, order):
    q = open_queue(redis_url, order)
    await q.enqueue([page("a", n) for n in range(6)])
    taken = await q.lease(3, 30000)  # the first three in the order
    await q.enqueue([page("a", n) for n in range(6, 9)])  # newer ones arrive meanwhile
    # back in another order than they were leased: each goes to its own place
    for lease in reversed(taken):
        assert await q.release([(lease.id, lease.token)]) == 1
    again = [name(lease.payload) for lease in await q.lease(20, 30000)]
    if order == "fifo":
        assert again == [f"a/{n}" for n in range(9)]
    else:  # lifo: the newest first; the three that came back (5, 4, 3) keep their place
        assert again == [f"a/{n}" for n in range(8, -1, -1)]
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_request_back_ahead_of_its_queue_ranks_its_host_again(redis_url):
    """a/0 leased and given back: a's queue is first again among the hosts (its head's
    place), not where a/1 had put it, behind the other hosts."""
    q = open_queue(redis_url, "fifo")
    # a/1 behind 60 other hosts: more than one lease call reads of the ready queues
    hosts = [page(f"h{n}", 0) for n in range(60)]
    await q.enqueue([page("a", 0), *hosts, page("a", 1)])
    (first,) = await q.lease(1, 30000)
    assert name(first.payload) == "a/0"
    assert await q.release([(first.id, first.token)]) == 1
    (again,) = await q.lease(1, 30000)
    assert name(again.payload) == "a/0"  # not h0/0: a's queue ranked by a/1's place
    await q.client.aclose()


URLS = [
    "http://Books.Example:8080/a",
    "https://user:pw@shop.example/x?y=1",
    "http://[::1]:6800/x",
    "http://10.0.0.1/",
    "https://xn--bcher-kva.example/",
    "http://host_with_underscore.test/",
    "http:///no-host",
    "mailto:nobody@example.com",
    "http://a b/",
    "http://brace}.example/",
]


def test_the_worker_and_the_scripts_read_the_same_host(redis_client):
    domain_of = scripts._expand('--- @include "stats"\n', "test", set())
    script = scripts.read_lua("lib/prelude") + domain_of + "\nreturn domain_of(ARGV[1])"
    for url in URLS:
        payload = json.dumps({"v": 1, "u": url}, separators=(",", ":"), ensure_ascii=False)
        payload = payload.encode()
        lua = redis_client.eval(script, 0, payload).decode()
        assert url_host(url) == payload_host(payload) == lua, url


@deferred_f_from_coro_f
async def test_a_back_queue_of_another_type_is_set_aside_and_the_lease_goes_on(redis_url):
    q = open_queue(redis_url)
    await q.enqueue([page("a.test", 1), page("b.test", 1)])
    await q.client.delete(KEYS.queue("0:a.test"))
    await q.client.set(KEYS.queue("0:a.test"), "a string where a list belongs")
    leases = await q.lease(10, 30000)
    assert [name(lease.payload) for lease in leases] == ["b.test/1"]
    assert len(await q.client.keys(KEYS.queue("0:a.test") + ":corrupt:*")) == 1
    assert await q.client.zrange(KEYS.ready, 0, -1) == []
    assert (await q.counts()).pending == 0  # the count kept is corrected once nothing is left
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_one_call_over_thousands_of_hosts_and_leases_splits_its_commands(redis_url):
    """Lua passes at most about 8,000 values to one command: a page whose 5,000 links each
    open a host's queue, a lease of all of them and their acks are still one call each."""
    q = open_queue(redis_url)
    n = 5000
    assert await q.enqueue([page(f"h{i}.test", i) for i in range(n)]) == n
    leases = await q.lease(n, 60000)
    assert len(leases) == n
    assert await q.ack([(lease.id, lease.token) for lease in leases]) == (n, 0)
    assert (await q.counts()).pending == 0
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_the_ready_set_of_a_few_hosts_is_a_skip_list_and_keeps_the_order(redis_url):
    # a small sorted set is a listpack, which each of a call's updates searches and moves
    # whole; the sync call converts the ready set (lib/types keep_wide) without a trace
    q = open_queue(redis_url)
    await q.enqueue([page(host, n) for n in (1, 2) for host in "abc"])
    assert await q.client.object("encoding", KEYS.ready) == b"skiplist"
    assert await q.client.zrange(KEYS.ready, 0, -1) == [b"0:a", b"0:b", b"0:c"]
    assert await lease_one_by_one(q, 6) == ["a/1", "b/1", "c/1", "a/2", "b/2", "c/2"]
    assert not await q.client.exists(KEYS.ready)  # emptied: deleted, as before
    await q.enqueue([page("d", 1)])
    assert await q.client.object("encoding", KEYS.ready) == b"skiplist"  # made again
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_leases_in_flight_are_kept_out_of_listpacks_from_32_on(redis_url):
    # a listpack is searched end to end at each write and lookup: with 64 leases in flight
    # that was a tenth of a sync call; below 32 a lone worker would pay the conversion at
    # every call (its leases acked each round, the keys made again)
    q = open_queue(redis_url)
    await q.enqueue([page("s", n) for n in range(40)])  # payloads under 64 bytes
    few = await q.lease(31, 30000)
    for key in (KEYS.leased, KEYS.leases, KEYS.payload):
        assert await q.client.object("encoding", key) == b"listpack"
    more = await q.lease(1, 30000)
    assert await q.client.object("encoding", KEYS.leased) == b"skiplist"
    assert await q.client.object("encoding", KEYS.leases) == b"hashtable"
    assert await q.client.object("encoding", KEYS.payload) == b"hashtable"
    assert await q.client.zcard(KEYS.leased) == await q.client.hlen(KEYS.leases) == 32
    assert await q.client.hlen(KEYS.payload) == 32  # nothing left behind
    await q.ack([(lease.id, lease.token) for lease in few + more])
    assert not await q.client.exists(KEYS.leased, KEYS.leases, KEYS.payload)
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_call_that_writes_nothing_over_maxmemory_leaves_the_encoding_and_succeeds(
    redis_url,
):
    # a script's first write that may grow memory is refused over maxmemory: the
    # conversion of a call that wrote nothing before must not fail the call
    q = open_queue(redis_url)
    await q.enqueue([page("a", 1)])
    score = await q.client.zscore(KEYS.ready, "0:a")
    await q.client.delete(KEYS.ready)
    await q.client.zadd(KEYS.ready, {"0:a": score})  # as reloaded from disk: a listpack
    await q.client.config_set("maxmemory", "1")
    try:
        await q.sync()  # refused as a function, run as a script: nothing to write
        assert await q.client.object("encoding", KEYS.ready) == b"listpack"
    finally:
        await q.client.config_set("maxmemory", "0")
    assert [name(lease.payload) for lease in await q.lease(1, 30000)] == ["a/1"]
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_lease_passes_over_the_hosts_a_worker_skips_and_leaves_them_ready(redis_url):
    """A worker whose downloads of a host are full (its buffer holds that host's next
    requests) names it: its lease takes the other hosts' requests in Scrapy's order, the
    head it is told of is another host's, and the skipped host's queue stays ready, in its
    place, for the next call (or another worker). Before, nothing passed a host over: a
    worker whose buffer filled with a slow host's requests leased only more of them."""
    q = open_queue(redis_url)
    await q.enqueue([page("slow", 1), page("slow", 2), page("a", 1), page("b", 1)])
    await q.enqueue([page("a", 2)])
    result = await q.sync(lease=2, skip={"slow": 0})
    assert [name(lease.payload) for lease in result.leases] == ["a/1", "b/1"]
    passed_over, first = (await q.sync(lease=0, skip={"slow": 0})).head, (await q.sync()).head
    assert passed_over and first and passed_over != first  # a/2's, and slow/1's
    assert await q.client.zscore(KEYS.ready, "0:slow") is not None
    assert await lease_one_by_one(q, 1) == ["slow/1"]  # first in order, once not skipped
    assert [name(x.payload) for x in (await q.sync(lease=5, skip={"slow": 0})).leases] == ["a/2"]
    assert not (await q.sync(lease=0, skip={"slow": 0})).head  # only the skipped host's left
    assert await lease_one_by_one(q, 1) == ["slow/2"]
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_skipped_hosts_request_of_a_higher_priority_is_leased_in_its_order(redis_url):
    """The worker skips a host up to the priority it holds of it: a request of the host of a
    higher priority (a page's urgent link) is named the head and leased first, as Scrapy's
    priority order wants; only the host's queues at that priority and below are passed
    over."""
    q = open_queue(redis_url)
    await q.enqueue([page("slow", 1), page("a", 1), page("slow", 9, 5)])
    head = (await q.sync(skip={"slow": 0})).head
    assert head is not None and head[0] == -5
    leased = (await q.sync(lease=2, skip={"slow": 0})).leases
    assert [name(lease.payload) for lease in leased] == ["slow/9", "a/1"]
    assert not (await q.sync(lease=0, skip={"slow": 0})).head
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_a_host_skipped_at_many_priorities_hides_neither_the_head_nor_the_others(
    redis_url,
):
    """A review found that the head named none when two queues of the skipped host (two
    priorities) led ready, and that a host skipped at 30 priorities used up the lease's
    looks: calls that leased nothing while another host's request waited."""
    q = open_queue(redis_url)
    await q.enqueue([page("slow", 1), page("slow", 2, -1), page("b", 1, -2)])
    head = (await q.sync(skip={"slow": 0})).head
    assert head is not None and head[0] == 2  # b/1's (minus its priority)
    await q.enqueue([page("slow", 10 + n, -3 - n) for n in range(30)] + [page("fast", 1, -40)])
    leased = (await q.sync(lease=2, skip={"slow": 0})).leases
    assert [name(lease.payload) for lease in leased] == ["b/1", "fast/1"]
    await q.client.aclose()
