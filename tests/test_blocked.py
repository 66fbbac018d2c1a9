"""A host whose download slot is full while the buffer holds its next requests does not hold
back the leasing of other hosts' requests (scrapy_ha.scheduler.blocked): the round's lease
passes it over, what it holds past half the target goes back to Redis while Redis has other
hosts' requests, Scrapy's priority order kept. The shell with the
fake session of tests/test_scheduler_shell.py; the lease's side against a real Redis is in
tests/test_frontier_queues.py, and ``bench/frontier_hol.py --workers 1 --concurrency 0``
measures a crawl (docs/benchmarks.md)."""

from __future__ import annotations

from scrapy import Request

from scrapy_ha import metakeys
from tests.test_keep import engine_busy, lease, send
from tests.test_scheduler_shell import shell

SLOW = "slow.test"


def slow_buffer(s, n: int) -> None:
    """*n* leases of the slow host buffered, its download slot full."""
    for i in range(n):
        lease(s, f"http://{SLOW}/{i}", i, 100 + i)
    s._slots.free = lambda crawler, request: SLOW not in request.url


def test_a_buffer_full_of_a_busy_hosts_requests_leases_the_others():
    """Before, the worker leased nothing more (the buffer over half its target) until the
    slow host's requests drained, one per download of seconds."""
    s, session, _ = shell()
    target = s._target()
    slow_buffer(s, target)
    assert s.next_request() is None  # all wait for the slot
    s.make_room()
    assert s.precedence.blocked.skip == {SLOW: 0}  # up to the priority it holds
    assert not s.outbox.releases and s.want() == 0  # Redis's other requests not known yet
    # the round skipped the host, and Redis named a head: another host's requests wait
    s.precedence.blocked.synced(s.precedence.blocked.skip, (0, 7))
    s.make_room()
    half = target // 2
    released = {pair[0] for pair in s.outbox.releases}
    assert released == {str(i) for i in range(half, target)}  # the last in line go back
    assert len(s._buffer) == half
    assert s.want() == target - half  # the others' requests, within the target


def test_a_crawl_of_one_busy_host_gives_nothing_back():
    """Redis holds no other host's request (the reply to a round that skipped the host
    named no head): the buffer keeps what it holds, and nothing goes back and forth."""
    s, session, _ = shell()
    target = s._target()
    slow_buffer(s, target)
    s.precedence.blocked.synced({SLOW: 0}, None)
    s.make_room()
    assert s.precedence.blocked.skip == {SLOW: 0}
    assert not s.outbox.releases and len(s._buffer) == target and s.want() == 0


def test_a_round_that_skipped_nothing_gives_nothing_back():
    """The head a round reports passes over the hosts that round skipped only: one that
    skipped nothing may have named the host's own queue."""
    s, session, _ = shell()
    slow_buffer(s, s._target())
    s.precedence.blocked.synced({}, (0, 7))
    s.make_room()
    assert not s.outbox.releases


def test_a_host_given_back_stays_skipped_while_its_slot_is_full():
    """A review found that once one of its downloads ended (half the target less one
    buffered), the host was no longer skipped: the round leased back what had just gone
    back, and the next gave it back again, a round trip per slow download."""
    s, session, _ = shell()
    target, half = s._target(), s._target() // 2
    slow_buffer(s, target)
    s.precedence.blocked.synced({SLOW: 0}, (0, 7))
    s.make_room()
    assert len(s._buffer) == half
    s._slots.free = lambda crawler, request: True
    assert s.next_request() is not None  # one download ends, one more starts
    s._slots.free = lambda crawler, request: SLOW not in request.url
    s.outbox.releases.clear()
    s.make_room()
    assert s.precedence.blocked.skip == {SLOW: 0}  # still passed over
    assert not s.outbox.releases and s.want() == target - (half - 1)


def test_a_crawl_of_one_busy_host_at_half_its_target_asks_redis_for_nothing():
    """A review found a lease call every tick (it could bring nothing: the only host is
    skipped) while the buffer held exactly half the target."""
    s, session, _ = shell()
    slow_buffer(s, s._target() // 2)
    s.precedence.blocked.synced({SLOW: 0}, None)
    s.make_room()
    assert s.precedence.blocked.skip == {SLOW: 0}
    assert s.want() == 0


def test_a_host_with_room_or_few_requests_buffered_is_not_skipped():
    s, _, _ = shell()
    target = s._target()
    slow_buffer(s, target // 2 - 1)
    for i in range(target // 2 + 1):
        lease(s, f"http://fast.test/{i}", 1000 + i, 500 + i)
    s.make_room()
    assert s.precedence.blocked.skip == {}
    s._slots.free = lambda crawler, request: True
    s.make_room()
    assert s.precedence.blocked.skip == {}


def test_a_lone_lifo_worker_still_keeps_a_skipped_hosts_newest_request_first():
    """Scrapy's LIFO order within the host: the new request is kept, ahead of the buffered
    ones of its priority, and what goes back is the last in line (the oldest)."""
    s, session, _ = shell()
    target = s._target()
    slow_buffer(s, target)
    engine_busy(s)
    s._slots.free = lambda crawler, request: SLOW not in request.url
    s.enqueue_request(Request(f"http://{SLOW}/new"))
    assert send(s) == 1  # kept, in the place of the last buffered one of its slot
    s.precedence.blocked.synced({SLOW: 0}, (0, 7))
    s.make_room()
    s._slots.free = lambda crawler, request: True
    handed = []
    while (request := s.next_request()) is not None:
        handed.append(request.url)
    assert handed[0] == f"http://{SLOW}/new"
    assert len(handed) == target // 2


def test_the_requests_given_back_are_the_leases_buffered():
    s, session, _ = shell()
    target = s._target()
    slow_buffer(s, target)
    leases = {tuple(r.meta[metakeys.LEASE]) for r in s._buffer}
    s.precedence.blocked.synced({SLOW: 0}, (0, 7))
    s.make_room()
    kept = {tuple(r.meta[metakeys.LEASE]) for r in s._buffer}
    assert kept | {tuple(p) for p in s.outbox.releases} == leases
    assert not kept & {tuple(p) for p in s.outbox.releases}


def test_a_head_the_session_does_not_wait_for_still_says_others_wait():
    """The session may hold back from waiting for a head Redis named (a lease that brought
    nothing of its priority: ``remote.leasable_head``), and then reports none; Redis still
    has other hosts' requests. A review found the worker then leased nothing until the
    slow host's next download ended (its ack made a sync), the engine idle meanwhile."""
    s, session, _ = shell()
    target = s._target()
    slow_buffer(s, target)
    s.precedence.blocked.synced({SLOW: 0}, (0, 7))  # Redis named a head...
    session.remote.head = None  # ... which the session does not wait for
    s.make_room()
    assert len(s.outbox.releases) == target - target // 2
    assert s.want() == target - target // 2


def test_busy_hosts_each_below_half_the_target_are_passed_over_together():
    """Three slow hosts each holding a third of the target, none half of it: before, none
    was skipped, the buffer stayed full of their requests and the worker leased nothing of
    its other hosts (one worker, 40 fast hosts and 3 of 3 s a page: fast pages fell from
    about 450 a second to none for most of a minute). Their sum is what counts."""
    s, session, _ = shell()
    target, half = s._target(), s._target() // 2
    hosts = ("a.slow.test", "b.slow.test", "c.slow.test")
    for i in range(target):
        lease(s, f"http://{hosts[i % 3]}/{i}", i, 100 + i)
    s._slots.free = lambda crawler, request: ".slow.test" not in request.url
    assert s.next_request() is None  # all wait for their slots
    s.make_room()
    assert set(s.precedence.blocked.skip) == set(hosts)
    s.precedence.blocked.synced(s.precedence.blocked.skip, (0, 7))  # others wait in Redis
    s.make_room()
    released = {pair[0] for pair in s.outbox.releases}
    assert released == {str(i) for i in range(half, target)}  # the last in line go back
    assert len(s._buffer) == half and s.want() == target - half
