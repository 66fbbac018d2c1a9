"""A crawl-wide rate holds when the worker's event loop stalls: a callback that blocks it
(a slow parse, a pause of the machine) must not let every start that came due meanwhile go
to the site at once (Scrapy's own DOWNLOAD_DELAY spaces a slot's requests from the last one
it sent, whatever the lateness)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING, Any

from scrapy import Request

from scrapy_ha import metakeys
from scrapy_ha.config.politeness import DomainLimit, Politeness
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
RATE, PAGES = 5.0, 60
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
    assert window <= RATE + RATE_TOLERANCE, (window, gaps)


def _leased(s: Any, url: str, entry_id: str, wait_ms: int) -> Request:
    request = Request(url)
    s.take(request, Lease(entry_id, f"t-{entry_id}", b"", wait_ms=wait_ms))
    return request


def test_a_worker_paces_its_own_starts_of_a_rate_limited_domain():
    """Two leases Redis let start now (their start times passed while the worker stalled):
    the second waits 1/rate after the first; another domain's does not."""
    limits = Politeness(domains={"a.test": DomainLimit(rate=0.2)})  # one start in 5 s

    s, _, _ = shell(politeness=limits)
    first = _leased(s, "http://a.test/1", "1", 0)
    second = _leased(s, "http://a.test/2", "2", 0)
    other = _leased(s, "http://b.test/1", "3", 0)
    assert s.next_request() is first
    assert s.next_request() is other  # a.test's next waits 5 s, b.test has no rate
    assert s.next_request() is None
    assert second.meta[metakeys.PACED] == "a.test"


def test_a_worker_without_limits_of_its_own_keeps_the_start_time_redis_gave():
    """The crawl's limits in Redis are the last started worker's: a worker started without
    any still holds a request until the start time its lease carries."""

    s, _, _ = shell()
    _leased(s, "http://a.test/1", "1", 5000)
    assert s.next_request() is None
    assert s.stats.get_value("ha/domain_limited") == 1
