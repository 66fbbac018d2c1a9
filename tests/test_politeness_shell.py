"""The worker's side of a crawl-wide rate limit: a leased request that Redis gave a start
time waits in the buffer until then (others go meanwhile), and a timer wakes the engine at
its time (the scheduler's shell against the fake session of test_scheduler_shell)."""

from __future__ import annotations

import asyncio
import time

from scrapy import Request
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.store.wire import Lease
from tests.test_scheduler_shell import shell

#: Seconds any poll of these tests waits before it fails (the machine is shared and slow).
DEADLINE = 30.0


@deferred_f_from_coro_f
async def test_a_leased_request_waits_for_its_start_time_and_others_go_meanwhile():
    s, _, engine = shell()
    woken: list[float] = []
    engine._slot.nextcall.schedule = lambda: woken.append(time.monotonic())
    first, held, other = (
        Request(u) for u in ("http://a.test/1", "http://a.test/2", "http://b.test/1")
    )
    leased = time.monotonic()
    s.take(first, Lease("1", "t-1", b"", 0, 0))
    s.take(held, Lease("2", "t-2", b"", 0, 300))  # may start 300 ms from now
    s.take(other, Lease("3", "t-3", b"", 0, 0))
    assert s.next_request() is first
    assert s.next_request() is other  # the held one waits, the rest of the buffer goes
    assert s.next_request() is None
    assert s.stats.get_value("ha/domain_limited") == 1
    deadline = time.monotonic() + DEADLINE
    while not woken:  # the engine is woken at the held request's time, not polled
        assert time.monotonic() < deadline, "the engine was never woken"
        await asyncio.sleep(0.01)
    assert woken[0] - leased >= 0.3
    assert s.next_request() is held
