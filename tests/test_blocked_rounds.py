"""A host whose download slot is full while the buffer holds its next requests (see
scrapy_ha.scheduler.blocked), against a real Redis and the worker's own rounds: the round
that first skips the host learns that Redis has other hosts' requests, and the next round,
at once, gives back what the host holds past half the target and leases the others'. A QA
run saw the worker wait for the background loop's tick between the two (one host of 3 s a
page among fast ones, the downloader running only the slow host's requests for 0.25 to
0.75 s after each wave of them ended); and a round with nothing else to send did not sync
at all, so the skip never reached Redis."""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.config.scheduler import SchedulerConfig
from scrapy_ha.scheduler import Scheduler
from scrapy_ha.store.sharding import make_queue
from scrapy_ha.store.wire import NewEntry

SLOW, FAST = "slow.test", "fast.test"


def _entries(host: str, n: int) -> list[NewEntry]:
    return [
        NewEntry(
            b"%s-%d" % (host.encode(), i), 0, b'{"v":1,"u":"http://%s/%d"}' % (host.encode(), i)
        )
        for i in range(n)
    ]


def _worker(redis_url: str) -> tuple[Scheduler, Any]:
    """A worker's scheduler on a fresh crawl's queue (its session driven round by round)."""
    with redis.Redis.from_url(redis_url) as admin:
        admin.delete(*(admin.keys("ha:{hol}*") or ["-"]))
    q = make_queue(redis.asyncio.Redis.from_url(redis_url), "ha", "hol", 1, worker="w")
    crawler = get_crawler()
    crawler._apply_settings()
    s = Scheduler(crawler, SchedulerConfig(worker_id="w", lease_time=60.0))
    s.session.queue = q
    return s, q


def _hosts(s: Scheduler) -> list[str]:
    return [entry[-1].url.split("/")[2] for entry in s._buffer.movable()]


@deferred_f_from_coro_f
async def test_a_host_first_skipped_gives_back_and_the_others_are_leased_at_once(redis_url):
    s, q = _worker(redis_url)
    target = s._target()
    half = target // 2
    await q.sync(enqueue=_entries(SLOW, target))  # first in line
    await q.sync(enqueue=_entries(FAST, target))
    await s.session._sync(lease=target)
    assert _hosts(s) == [SLOW] * target
    s._slots.free = lambda crawler, request: SLOW not in request.url  # its slot is full
    assert s.next_request() is None
    # the round skips the slow host: its sync's reply names the fast host's head
    assert await s.session._round() is True  # before: False, no sync (nothing to send)
    await s.session._round()
    assert _hosts(s).count(SLOW) == half  # those past half went back
    assert _hosts(s).count(FAST) == target - half  # and the others' were leased
    assert s.next_request().url.startswith(f"http://{FAST}/")
    # the host stays skipped while its slot is full: no more rounds at once
    assert await s.session._round() is False
    await q.client.aclose()


@deferred_f_from_coro_f
async def test_slots_that_flip_at_every_round_do_not_run_rounds_back_to_back(
    redis_url: str,
) -> None:
    """Two busy hosts, each holding half the target, their slots full in turn (a download of
    one ended, one of the other began, between any two rounds): every round's skip names a
    host the sync before did not skip, and Redis has a third host's requests. The rounds ran
    at once one after another, a sync each, as fast as Redis answered (a review: 1620 syncs
    a second); now one runs at once, the next waits for the tick or a wake."""
    s, q = _worker(redis_url)
    target = s._target()
    half = target // 2
    await q.sync(enqueue=_entries("a.test", half))
    await q.sync(enqueue=_entries("b.test", target - half))
    await q.sync(enqueue=_entries(FAST, 10 * target))
    await s.session._sync(lease=target)
    full = ["a.test"]
    s._slots.free = lambda crawler, request: full[0] not in request.url  # type: ignore[method-assign]
    again = []
    for turn in range(6):
        full[0] = ("a.test", "b.test")[turn % 2]
        again.append(await s.session._round())
    assert again[0] is True  # the first skip: at once, as above
    assert not any(again[i] and again[i + 1] for i in range(len(again) - 1)), again
    await q.client.aclose()
