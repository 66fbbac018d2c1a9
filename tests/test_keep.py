"""A LIFO worker alone keeps its new requests in its buffer (scrapy_ha.scheduler.keep): stored
leased to it by the round that sends them, ahead of the older leases of their priority, within
the buffer's bound; what no longer fits goes back to Redis. The shell with the fake session of
tests/test_scheduler_shell.py; sync.lua on a real redis-server; tests/test_same_order.py
compares whole crawls with Scrapy's own scheduler."""

from __future__ import annotations

from urllib.parse import urlparse

import redis.asyncio
from scrapy import Request
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.config.scheduler import SchedulerConfig
from scrapy_ha.keys import Keys
from scrapy_ha.scheduler.shell import Scheduler
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.wire import Fresh, Lease, NewEntry, packed_children
from tests.test_scheduler_shell import shell


def lease(s, url: str, i: int, part: int, *, priority: int = 0, expiries: int = 0) -> None:
    request = Request(url, priority=priority)
    s.take(request, Lease(str(i), f"t{i}", b"", expiries, 0, place=(-priority, part)))


def engine_busy(s) -> None:
    """The engine has no room: new requests wait for the round (they are not handed out)."""
    s.handout.looked()
    s._slots.free = lambda crawler, request: False


def send(s, dropped: frozenset[str] = frozenset()) -> int:
    """What a round does with the outbox's children: seal, send, settle (Redis stored all
    but the entry ids *dropped*); return how many were kept."""
    batch = s.outbox.children[:]
    kept = s.handout.seal(batch)
    s.outbox.children_stored(len(batch))
    s.handout.settle(batch, set(dropped))
    return kept


def urls(s) -> list[str]:
    s._slots.free = lambda crawler, request: True
    out = []
    while (request := s.next_request()) is not None:
        out.append(request.url)
    return out


def test_new_requests_go_before_older_leases_of_their_priority_newest_first():
    s, _, _ = shell()
    lease(s, "http://a.test/old0", 0, 10)
    lease(s, "http://a.test/old1", 1, 11)
    engine_busy(s)
    for n in range(3):
        assert s.enqueue_request(Request(f"http://a.test/new{n}"))
    assert send(s) == 3
    assert s.stats.get_value("ha/kept") == 3 and s.stats.get_value("ha/leased") == 3
    assert not s.outbox.releases
    assert urls(s) == [f"http://a.test/{u}" for u in ("new2", "new1", "new0", "old0", "old1")]


def test_a_kept_request_is_sent_leased_to_the_worker_not_handed():
    s, _, _ = shell()
    engine_busy(s)
    s.enqueue_request(Request("http://a.test/new"))
    s.handout.seal(s.outbox.children)
    (entry,) = s.outbox.children
    entry_id, token = entry.taken
    (arg,) = packed_children([entry])
    assert arg.split(b" ")[2] == b"=%s/%s" % (entry_id.encode(), token.encode())


def test_what_no_longer_fits_goes_back_to_redis_last_in_line_first():
    s, _, _ = shell()
    full = 2 * s._target()
    lease(s, "http://a.test/high", 0, 5, priority=1)
    for i in range(1, full):
        lease(s, f"http://a.test/old{i}", i, 10 + i)
    engine_busy(s)
    for n in range(3):
        s.enqueue_request(Request(f"http://a.test/new{n}"))
    assert send(s) == 3
    # the three last in line: the oldest of priority 0
    assert sorted(s.outbox.releases) == [(str(i), f"t{i}") for i in range(full - 3, full)]
    got = urls(s)
    assert got[:4] == [f"http://a.test/{u}" for u in ("high", "new2", "new1", "new0")]
    assert len(got) == full


def test_new_requests_that_do_not_fit_go_pending_the_oldest_first():
    s, _, _ = shell()
    fits = s._target()  # what it leases ahead
    engine_busy(s)
    for n in range(fits + 2):
        s.enqueue_request(Request(f"http://a.test/new{n}"))
    batch = s.outbox.children[:]
    assert s.handout.seal(batch) == fits
    assert [e.taken is None for e in batch[:3]] == [True, True, False]


def test_a_request_below_a_full_buffer_is_not_kept_and_nothing_is_given_back():
    s, _, _ = shell()
    for i in range(2 * s._target()):
        lease(s, f"http://a.test/old{i}", i, 10 + i)
    engine_busy(s)
    s.enqueue_request(Request("http://a.test/low", priority=-1))
    assert send(s) == 0
    assert not s.outbox.releases and s.outbox.top == -1  # it goes pending


def test_a_suspect_is_never_given_back():
    s, _, _ = shell()
    full = 2 * s._target()
    lease(s, "http://a.test/suspect", 0, 99, priority=-5, expiries=5)
    for i in range(1, full):
        lease(s, f"http://a.test/old{i}", i, 10 + i)
    engine_busy(s)
    s.enqueue_request(Request("http://a.test/new"))
    send(s)
    assert s.outbox.releases == [(str(full - 1), f"t{full - 1}")]


def test_the_engine_waits_for_kept_requests_on_their_way():
    s, _, _ = shell()
    lease(s, "http://a.test/old", 0, 10)
    engine_busy(s)
    s.enqueue_request(Request("http://a.test/new"))
    batch = s.outbox.children[:]
    s.handout.seal(batch)
    s._slots.free = lambda crawler, request: True
    assert s.next_request() is None and s.outbox.held_back  # not the older one
    assert len(s) == 2 and s.has_pending_requests()
    s.outbox.children_stored(1)
    s.handout.settle(batch, set())
    assert s.next_request().url == "http://a.test/new"


def test_a_kept_request_redis_refuses_is_forgotten():
    s, _, _ = shell()
    engine_busy(s)
    s.enqueue_request(Request("http://a.test/dup"))
    batch = s.outbox.children[:]
    s.handout.seal(batch)
    entry_id = batch[0].taken[0]
    s.outbox.children_stored(1)
    s.handout.settle(batch, {entry_id})
    assert len(s) == 0 and s.next_request() is None
    assert s.precedence.keep.flying == 0 and not s.precedence.keep.ahead()


def test_nothing_is_kept_in_fifo_for_start_requests_or_limited_domains_or_when_paused():
    s, _, _ = shell(order="fifo")
    engine_busy(s)
    s.enqueue_request(Request("http://a.test/fifo"))
    assert send(s) == 0

    s, session, _ = shell()
    engine_busy(s)
    s.enqueue_request(Request("http://a.test/start", meta={"is_start_request": True}))
    session.remote.paused = True
    s.enqueue_request(Request("http://a.test/paused"))
    assert s.handout.seal(s.outbox.children[:]) == 0

    s, _, _ = shell()
    s.precedence.keep._may_keep = lambda request: "limited" not in request.url
    engine_busy(s)
    s.enqueue_request(Request("http://limited.test/1"))
    s.enqueue_request(Request("http://a.test/free"))
    batch = s.outbox.children[:]
    assert s.handout.seal(batch) == 1 and batch[0].taken is None


def test_a_request_of_a_domain_behind_a_closed_gate_is_not_kept():
    """A domain that answered 429 with a Retry-After waits behind its gate: its new
    requests go pending, where Redis's frontier holds its queue until the gate opens,
    instead of filling the buffer with leases renewed for as long as the gate stays
    closed, room other hosts' requests then wait for. Before, the keep checked the
    crawl-wide limits alone."""
    s, _, _ = shell()
    engine_busy(s)
    s.close_gate(Request("http://gated.test/page"), 60)
    s.enqueue_request(Request("http://gated.test/1"))
    s.enqueue_request(Request("http://a.test/free"))
    batch = s.outbox.children[:]
    assert s.handout.seal(batch) == 1
    assert batch[0].taken is None and batch[1].taken is not None
    s.outbox.gates.clear()  # the close sent to Redis (a close not sent yet outlives a reply)
    s.set_gates({}, every=True)  # the gate open again (Redis says so): kept as before
    s.enqueue_request(Request("http://gated.test/2"))
    assert s.handout.seal(s.outbox.children[2:]) == 1


@deferred_f_from_coro_f
async def test_sync_stores_a_kept_request_leased_not_handed_and_refuses_a_duplicate(redis_url):
    client = redis.asyncio.Redis.from_url(redis_url)
    keys = Keys("ha", "keep")
    q = RedisQueue(client, keys, order="lifo")
    try:
        payload = b'{"v":1,"u":"http://a.test/1"}'
        kept = Fresh(Request("http://a.test/1"), lease=("w.1", "w-1"), kept=True)
        again = Fresh(Request("http://a.test/1"), lease=("w.2", "w-2"), kept=True)
        result = await q.sync(enqueue=[NewEntry(b"fp", 0, payload, fresh=kept)], worker="w")
        assert result.added == 1 and not result.dropped and not result.leases
        counts = await q.counts()
        assert (counts.pending, counts.leased) == (0, 1)
        record = await client.hget(keys.leases, "w.1")
        assert record.startswith(b"w-1 ") and not record.endswith(b" h")  # not handed
        assert await client.hget(keys.grant("w"), "w.1") == b"w-1"  # the keeper renews it
        result = await q.sync(enqueue=[NewEntry(b"fp", 0, payload, fresh=again)])
        assert result.dropped == {"w.2"}  # a duplicate: not stored
        assert await q.release([("w.1", "w-1")]) == 1  # back to pending at its place
        assert (await q.counts()).pending == 1
    finally:
        await client.flushdb()
        await client.aclose()


@deferred_f_from_coro_f
async def test_leases_kept_requests_crowd_out_go_back_in_the_round_that_stores_them(redis_url):
    """Given back by the next round, they stayed leased in Redis beside the kept requests
    for a round: a worker killed then left both to redo (up to 71 leases held against 64
    in tests/test_crash.py once the acks were capped)."""
    client = redis.asyncio.Redis.from_url(redis_url)
    q = RedisQueue(client, Keys("ha", "crowd"), order="lifo")
    crawler = get_crawler()
    crawler._apply_settings()
    s = Scheduler(crawler, SchedulerConfig(order="lifo"))
    s.session.queue = q
    try:
        full = s._target()
        old = [b'{"v":1,"u":"http://a.test/old%d"}' % i for i in range(full)]
        await q.sync(enqueue=[NewEntry(b"", 0, payload) for payload in old])
        await s.session._sync(lease=full)
        assert len(s._buffer) == full == (await q.counts()).leased
        engine_busy(s)
        for n in range(full):  # newer, so first in line: each takes a buffered one's place
            assert s.enqueue_request(Request(f"http://a.test/new{n}"))
        await s.session._sync(lease=0)
        assert {r.url for r in s._buffer} == {f"http://a.test/new{n}" for n in range(full)}
        assert s.outbox.releases == []  # given back already
        counts = await q.counts()
        assert (counts.leased, counts.pending) == (full, full)
        assert s.stats.get_value("ha/released") == full
    finally:
        await client.flushdb()
        await client.aclose()


def test_a_kept_request_leaves_the_room_made_for_a_higher_priority_in_redis():
    # review: it took that room, the head was never leased and the engine waited each round
    s, session, _ = shell()
    for i in range(2 * s._target()):
        lease(s, f"http://a.test/old{i}", i, 10 + i)
    session.remote.head = (-1, 0)  # Redis holds a priority-1 request
    leased = 0
    for r in range(5):  # rounds as Session._round runs them
        s.make_room()
        s.outbox.releases.clear()  # sent
        engine_busy(s)
        s.enqueue_request(Request(f"http://a.test/child{r}"))
        kept = s.handout.seal(s.outbox.children[:])
        leased += s.want() if kept else 1
        s.outbox.children.clear()
    assert leased == 5  # every round leases the priority-1 head


def test_a_busy_slots_new_requests_crowd_out_only_its_own_leases():
    # review: with DownloaderAwarePriorityQueue they gave an idle slot's leases back
    s, _, engine = shell(slot_fair=True)
    engine.downloader.get_slot_key = lambda request: urlparse(request.url).hostname
    for i in range(4):
        lease(s, f"http://b.test/{i}", i, 10 + i)  # an idle slot's work
    for i in range(4, 2 * s._target()):
        lease(s, f"http://a.test/old{i}", i, 10 + i)
    engine_busy(s)
    for n in range(40):
        s.enqueue_request(Request(f"http://a.test/new{n}"))
    send(s)
    released = {entry_id for entry_id, _ in s.outbox.releases}
    assert released and not released & {"0", "1", "2", "3"}
    assert "b.test" in {urlparse(r.url).hostname for r in s._buffer}


def test_with_another_live_worker_nothing_is_kept_and_leases_go_first():
    # review: a worker that preferred its new requests held its buffered leases for as long
    # as its part of the crawl went deeper, where other workers could not have them
    s, session, _ = shell()
    session.renewals.workers = 2
    lease(s, "http://a.test/old", 0, 10)
    engine_busy(s)
    s.enqueue_request(Request("http://a.test/new"))
    assert s.handout.seal(s.outbox.children[:]) == 0
    s, session, _ = shell()
    session.renewals.workers = 2
    lease(s, "http://a.test/old", 0, 10)
    s.enqueue_request(Request("http://a.test/new"))
    assert s.next_request().url == "http://a.test/old"


def test_a_lease_with_a_start_time_is_not_given_back():
    # review: its domain's rate slot was taken: given back, it would be lost
    s, _, _ = shell()
    full = 2 * s._target()
    for i in range(full - 1):
        lease(s, f"http://a.test/old{i}", i, 10 + i)
    rated = Request("http://a.test/rated")
    s.take(rated, Lease("r", "tr", b"", 0, 500, place=(0, 99)))  # wait_ms: unplaced
    engine_busy(s)
    s.enqueue_request(Request("http://a.test/new"))
    send(s)
    assert s.outbox.releases == [(str(full - 2), f"t{full - 2}")]


@deferred_f_from_coro_f
async def test_a_renewal_counts_the_live_workers(redis_url):
    client = redis.asyncio.Redis.from_url(redis_url)
    q = RedisQueue(client, Keys("ha", "alone"))
    try:
        await q.renew([], worker="w1", lease_ms=1000, heartbeat_ms=30_000)
        assert q.live_workers == 1
        await q.renew([], worker="w2", lease_ms=1000, heartbeat_ms=30_000)
        assert q.live_workers == 2
    finally:
        await client.flushdb()
        await client.aclose()
