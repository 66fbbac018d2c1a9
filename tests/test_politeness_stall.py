"""A crawl-wide rate holds when the worker's event loop stalls: a callback that blocks it
(a slow parse, a pause of the machine) must not let every start that came due meanwhile go
to the site at once (Scrapy's own DOWNLOAD_DELAY spaces a slot's requests from the last one
it sent, whatever the lateness)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from scrapy import Request

from scrapy_ha import metakeys
from scrapy_ha.config.politeness import DomainLimit, Politeness
from scrapy_ha.scheduler.domains import StartTimes
from scrapy_ha.store.wire import Lease
from tests.test_politeness_crawl import (  # noqa: F401, F811 (a fixture)
    DEADLINE,
    RATE_TOLERANCE,
    counting_site,
)
from tests.test_scheduler_shell import shell

if TYPE_CHECKING:
    from pathlib import Path

#: The domain's rate (starts per second, crawl-wide) and the pages of its tree.
RATE, PAGES = 10.0, 100
#: Starts a 1 s window may hold: a late worker catches up at 4/3 of the rate at most
#: (StartTimes.CATCH_UP), plus the jitter the crawl-wide test allows. Before, the starts
#: that came due during the stall went at once: 21 in a second (the worker holds about a
#: second of them, then the next second's).
MOST_IN_A_SECOND = math.ceil(RATE * 4 / 3) + RATE_TOLERANCE
#: Seconds the spider's callback of one page blocks the event loop: starts that come due
#: meanwhile (about RATE a second) would all go at once when it ends.
STALL = 2.0

SPIDER = """
import time

import scrapy


class Tree(scrapy.Spider):
    name = "stall"
    custom_settings = {"CONCURRENT_REQUESTS": 16}
    stalled = False

    def __init__(self, root="", **kwargs):
        super().__init__(**kwargs)
        self.start_urls = [root]

    def parse(self, response):
        yield from response.follow_all(css="a")
        if response.url.endswith("/p/5") and not self.stalled:
            self.stalled = True
            time.sleep(%(stall)r)  # a callback that blocks the event loop
"""


def test_a_stalled_worker_keeps_its_domains_rate(tmp_path: Path, redis_url, counting_site):  # noqa: F811
    site = counting_site(PAGES)
    spider = tmp_path / "stall.py"
    spider.write_text(SPIDER % {"stall": STALL})
    args = [sys.executable, "-m", "scrapy.cmdline", "runspider", str(spider)]
    args += ["-a", f"root=http://localhost:{site.port}/p/0", "-s", "LOG_LEVEL=INFO"]
    settings = {
        "ADDONS": '{"scrapy_ha.Addon": 0}',
        "REDIS_URL": redis_url,
        "TELNETCONSOLE_ENABLED": "False",
        "HA_DOMAIN_LIMITS": json.dumps({"localhost": {"rate": RATE}}),
        "HA_IDLE_TIMEOUT": "2",
    }
    for key, value in settings.items():
        args += ["-s", f"{key}={value}"]
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(args, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    try:
        proc.wait(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    starts = sorted(site.starts["localhost"])
    gaps = [round(b - a, 2) for a, b in zip(starts, starts[1:], strict=False)]
    print("gaps between starts:", gaps)
    assert proc.returncode == 0, log.read_text()[-3000:]
    served = {path: n for (host, path), n in site.hits.items() if host == "localhost"}
    assert served == {f"/p/{n}": 1 for n in range(PAGES)}  # nothing lost, nothing repeated
    assert max(gaps) >= STALL * 0.9  # the stall happened while starts were due
    window = site.most_in_a_second("localhost")
    assert window <= MOST_IN_A_SECOND, (window, gaps)


def _leased(s: Any, url: str, entry_id: str, wait_ms: int) -> Request:
    request = Request(url)
    s.take(request, Lease(entry_id, f"t-{entry_id}", b"", wait_ms=wait_ms))
    return request


def _late(request: Request, seconds: float) -> None:
    """As if the worker's event loop stalled: the start time Redis gave is *seconds* past."""
    request.meta[metakeys.NOT_BEFORE] = time.monotonic() - seconds


def test_a_late_start_holds_its_domains_next_for_part_of_redis_spacing():
    """Two leases of a.test (a start in 10 s) whose start times, 10 s apart, passed while the
    worker stalled: the second waits 3/4 of that spacing after the first started; b.test's,
    without a rate, does not."""
    s, _, _ = shell(politeness=Politeness(domains={"a.test": DomainLimit(rate=0.1)}))
    first = _leased(s, "http://a.test/1", "1", 1000)
    second = _leased(s, "http://a.test/2", "2", 2000)
    other = _leased(s, "http://b.test/1", "3", 1000)
    _late(first, 20)
    _late(second, 10)
    _late(other, 5)
    assert s.next_request() is first
    assert s.next_request() is other  # a.test's next waits 7.5 s
    assert s.next_request() is None
    assert second.meta[metakeys.PACED] == ("2", "a.test", 10.0)


def test_a_lease_redis_let_start_at_once_is_paced_after_a_late_start():
    """The first lease of a domain after a stall has no wait (its start time lapsed in
    Redis): it is held too, for 3/4 of the domain's 1/rate, not of the stall (a review:
    before, it went with the late one; and a spacing that held the stall idled the domain
    for 3/4 of it)."""
    s, _, _ = shell(politeness=Politeness(domains={"a.test": DomainLimit(rate=0.25)}))
    first = _leased(s, "http://a.test/1", "1", 1000)
    _late(first, 20)
    assert s.next_request() is first
    _leased(s, "http://a.test/2", "2", 0)  # its start time: now
    assert s.next_request() is None
    assert s._starts._timer_at is not None
    assert 2.5 < s._starts._timer_at - time.monotonic() <= 3.0  # 3/4 of 4 s


def test_a_start_on_time_does_not_hold_the_next():
    """A start late by no more than an event loop's jitter (StartTimes.LATE_S) holds
    nothing: the next request keeps its own time, even one due right after it."""
    times = StartTimes(lambda: None, lambda domain: 1.0)
    first, second = Request("http://a.test/1"), Request("http://a.test/2")
    for n, request in enumerate((first, second)):
        request.meta[metakeys.LEASE] = (str(n), "t")
        times.hold(request, 0)
    _late(first, 0.002)
    _late(second, 0.001)  # due 1 ms after the first, and past: it goes now
    times.started(first)
    assert not times.waits(second)


def test_a_redirect_that_took_a_held_requests_meta_is_not_paced():
    """A copy of a held request's meta (a redirect, ``Request.replace``) under another
    lease: not its domain's start (before, its domain's next waited for it)."""
    times = StartTimes(lambda: None, lambda domain: 1.0)
    page = Request("http://a.test/1", meta={metakeys.LEASE: ("1", "t")})
    times.hold(page, 0)
    _late(page, 20)
    redirect = page.replace(url="http://www.a.test/1")
    redirect.meta[metakeys.LEASE] = ("9", "t")  # kept under a lease of its own
    times.started(redirect)
    assert not times._last
    assert not times.waits(redirect)  # its own start time passed: it goes


def test_a_worker_without_limits_of_its_own_keeps_the_start_time_redis_gave():
    """The crawl's limits in Redis are the last started worker's: a worker started without
    any still holds a request until the start time its lease carries."""

    s, _, _ = shell()
    _leased(s, "http://a.test/1", "1", 5000)
    assert s.next_request() is None
    assert s.stats.get_value("ha/domain_limited") == 1


def _held_for(times: StartTimes, waits_ms: list[int], late_s: float) -> float:
    """Seconds the second of requests leased with *waits_ms* waits after the first, late
    by *late_s* (so is the second), started (0: it goes at once)."""
    requests = [Request(f"http://a.test/{n}") for n in range(len(waits_ms))]
    for n, (request, wait_ms) in enumerate(zip(requests, waits_ms, strict=True)):
        request.meta[metakeys.LEASE] = (str(n), "t")
        times.hold(request, wait_ms)
    first, second = requests[0], requests[1]
    gap = second.meta[metakeys.NOT_BEFORE] - first.meta[metakeys.NOT_BEFORE]
    _late(first, late_s)
    _late(second, late_s - gap)  # Redis's spacing kept: both late by the stall
    started = time.monotonic()
    times.started(first)
    if not times.waits(second):
        return 0.0
    assert times._timer_at is not None
    return times._timer_at - started


def test_the_spacing_is_this_workers_share_of_the_domains_starts():
    """Two workers at a crawl-wide rate of 10: Redis gives this one every other start time
    (0.2 s apart); after a stall its late ones go 3/4 of that apart, not of 1/rate (a
    review: the crawl's rate, 4/3 of it, on top of the other worker's share)."""
    held = _held_for(StartTimes(lambda: None, lambda domain: 0.1), [200, 400, 600, 800], 2.0)
    assert 0.14 < held <= 0.16  # 3/4 of the 0.2 s Redis gave between the two


def test_without_a_rate_of_its_own_the_start_times_redis_gave_pace_it():
    """A worker whose settings lack the domain's rate (Redis's limits are the last started
    worker's): its late requests are paced by the spacing of the start times Redis gave
    (a review: 11 went at once after a 1 s stall)."""
    held = _held_for(StartTimes(lambda: None, lambda domain: 0.0), [100, 200, 300], 1.0)
    assert held > 0
