"""The lease buffer against what Redis holds: a request of a higher priority pending in
Redis makes the engine wait one round trip for it, and only when the next round will lease
it (never for ever, never while paused, never over twice the prefetch target); the buffer
keeps Redis's order across lease calls (the shell with the fake session of
tests/test_scheduler_shell.py; tests/test_same_order.py compares whole crawls)."""

from __future__ import annotations

from types import SimpleNamespace
from urllib.parse import urlparse

from scrapy import Request

from scrapy_ha.scheduler.remote import FUTILE_SECONDS, leasable_head
from scrapy_ha.store.wire import Lease, SyncResult
from tests.test_scheduler_shell import shell

#: What Redis's head looks like at priority 1 (see scrapy_ha.store.wire.score_key).
PRIORITY_1 = (-1, 7)


def lease(s, url: str, i: int, place, *, priority: int = 0, expiries: int = 0) -> Request:
    request = Request(url, priority=priority)
    s.take(request, Lease(str(i), f"t{i}", b"", expiries, 0, place=place))
    return request


def test_a_higher_priority_in_redis_holds_the_engine_back_and_is_leased_by_the_next_round():
    s, session, _ = shell()
    for i in range(4):
        lease(s, f"http://a.test/{i}", i, (0, i))
    wakes = session.wakes
    session.remote.head = PRIORITY_1
    assert s.next_request() is None and s.outbox.held_back
    assert session.wakes > wakes  # the round runs now, not at the next tick
    assert s.want() > 0
    session.remote.head = (0, 99)  # the next sync: Redis's head is of the buffer's priority
    assert s.next_request().url == "http://a.test/0"


def test_the_buffer_keeps_redis_order_across_lease_calls():
    s, _, _ = shell()
    lease(s, "http://a.test/late", 1, (0, 50))  # leased first, later in Redis's order
    lease(s, "http://a.test/early", 2, (0, 10))
    lease(s, "http://a.test/high", 3, (-1, 90), priority=1)
    assert [s.next_request().url for _ in range(3)] == [
        "http://a.test/high",
        "http://a.test/early",
        "http://a.test/late",
    ]


def test_a_full_buffer_gives_back_its_last_lease_but_not_a_suspect():
    # review: with the buffer full and a suspect last, the engine was held back for ever
    s, session, _ = shell()
    full = 2 * s._target()
    for i in range(full - 1):
        lease(s, f"http://a.test/{i}", i, (0, i))
    lease(s, "http://a.test/s", 99, (1, 0), priority=-1, expiries=5)
    session.remote.head = PRIORITY_1
    assert s.want() == 0 and s.next_request() is None  # the round makes room first
    s.make_room()
    assert s.outbox.releases == [(str(full - 2), f"t{full - 2}")]  # not the suspect
    assert s.want() == 1
    s.make_room()  # one per round
    assert len(s.outbox.releases) == 1


def test_a_full_buffer_gives_nothing_back_for_a_priority_below_its_head():
    s, session, _ = shell()
    lease(s, "http://a.test/top", 0, (-2, 0), priority=2)
    for i in range(1, 2 * s._target()):
        lease(s, f"http://a.test/{i}", i, (0, i))
    session.remote.head = PRIORITY_1  # above the last, below the head: the head goes first
    s.make_room()
    assert not s.outbox.releases and s.want() == 0
    assert s.next_request().url == "http://a.test/top"


def test_a_paused_crawl_or_a_suspect_at_the_head_does_not_wait_for_redis():
    s, session, _ = shell()
    lease(s, "http://a.test/0", 0, (0, 0))
    session.remote.head, session.remote.paused = PRIORITY_1, True
    assert s.next_request().url == "http://a.test/0"

    s, session, _ = shell()
    lease(s, "http://a.test/s", 0, (0, 0), expiries=5)
    session.remote.head = PRIORITY_1
    s.next_request()  # a suspect waits to run alone, not for Redis
    assert not s.outbox.held_back


def test_several_download_slots_go_by_their_load_not_by_what_redis_holds():
    # review: the least busy slot's request held back for a priority of a busy slot
    s, session, engine = shell(slot_fair=True, order="fifo")
    downloader = engine.downloader
    downloader.get_slot_key = lambda r: urlparse(r.url).hostname
    downloader.slots = {"a.test": SimpleNamespace(active=set(range(8)), concurrency=8)}
    for i in range(3):
        lease(s, f"http://a.test/{i}", i, (0, i))
    lease(s, "http://b.test/x", 50, (0, 50))
    session.remote.head = PRIORITY_1
    assert s.next_request().url == "http://b.test/x"


def test_priorities_beyond_the_stored_range_compare_as_stored():
    s, _, _ = shell()
    lease(s, "http://a.test/top", 1, (-4095, 0), priority=9000)
    child = Request("http://a.test/child", priority=5000)  # stored as 4095 too
    s.outbox.note_priority(child.priority)
    assert not s.precedence.outranked()


def test_a_buffer_over_twice_its_target_drains_without_waiting():
    # review: the target shrank under a doubled buffer: held back one round per release
    s, session, _ = shell()
    for i in range(2 * s._target() + 3):
        lease(s, f"http://a.test/{i}", i, (0, i))
    session.remote.head = PRIORITY_1
    s.make_room()
    assert not s.outbox.releases and s.want() == 0
    assert s.next_request().url == "http://a.test/0"


def _synced(head, *leased):
    leases = [Lease(str(i), f"t{i}", b"", 0, 0, place=place) for i, place in enumerate(leased)]
    return SyncResult(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, head=head, leases=leases)


def test_a_head_a_lease_call_failed_to_bring_is_not_waited_for_a_while():
    # review: a head its domain's limit parks at every call held the engine back every
    # other round (each ack-only sync reported it again)
    head, futile = leasable_head(
        _synced(PRIORITY_1), waited=PRIORITY_1, asked=True, futile=None, now=0
    )
    assert head is None
    head, futile = leasable_head(
        _synced(PRIORITY_1), waited=None, asked=False, futile=futile, now=0.5
    )
    assert head is None  # an ack-only sync reports it again: still not waited for
    later = FUTILE_SECONDS + 0.1
    head, _ = leasable_head(_synced(PRIORITY_1), waited=None, asked=False, futile=futile, now=later)
    assert head == PRIORITY_1  # tried again after a while


def test_a_lease_of_the_waited_priority_ends_the_pause():
    synced = _synced((-1, 9), (0, 3))  # a lower priority came: the head was parked
    _, futile = leasable_head(synced, waited=PRIORITY_1, asked=True, futile=None, now=0)
    assert futile is not None
    synced = _synced((-1, 12), (-1, 9))  # one of priority 1 came this time
    head, futile = leasable_head(synced, waited=None, asked=True, futile=futile, now=0.1)
    assert (head, futile) == ((-1, 12), None)
    _, futile = leasable_head(_synced(None, (-1, 3)), waited=(0, 1), asked=True, futile=None)
    assert futile is None  # what it waited for came (or better)
