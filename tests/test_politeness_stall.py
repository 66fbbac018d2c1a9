"""A crawl-wide rate holds when the worker's event loop stalls: a callback that blocks it
(a slow parse, a pause of the machine) must not let every start that came due meanwhile go
to the site at once (Scrapy's own DOWNLOAD_DELAY spaces a slot's requests from the last one
it sent, whatever the lateness)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import TYPE_CHECKING

from tests.test_politeness_crawl import (  # noqa: F401, F811 (a fixture)
    DEADLINE,
    RATE_TOLERANCE,
    counting_site,
)

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
