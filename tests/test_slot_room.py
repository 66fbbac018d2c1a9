"""The scheduler hands a host no more requests than its download slot has room for, while
it hands out (scheduler/engine/slots.py ``SlotLoad``): a request handed out is counted until
the engine has it. A QA run: 100 hosts answering 429 at once got up to 17 requests each
within a millisecond (after ``Retry-After: 60``) with two allowed at once: a count made as
the scheduler handed out forgot each request of the host before the engine had it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import pytest
import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.demo import harness
from tests.cli_seed import scrapy_ha

pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")

SITE = str(Path(__file__).parent / "rate_limited_hosts.py")


class Pushed(scrapy.Spider):
    """The crawl as pushed: its requests leased from Redis."""

    name = "hosts429"

    async def start(self) -> Any:
        return
        yield


@deferred_f_from_coro_f
async def test_hosts_answering_429_at_once_get_no_more_than_their_slots_hold(redis_url):
    proc, (port,) = harness.start_listening([sys.executable, SITE])
    try:
        urls = [f"http://127.0.9.{h}:{port}/p/{i}" for i in range(20) for h in range(1, 101)]
        pushed = scrapy_ha(
            "push",
            "hosts429",
            "-",
            "--create",
            "--redis-url",
            redis_url,
            input="\n".join(urls),
            stdin=None,
        )
        assert pushed.returncode == 0, pushed.stderr
        settings = {
            "ADDONS": {"scrapy_ha.Addon": 0},
            "REDIS_URL": redis_url,
            "CONCURRENT_REQUESTS": 32,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
            "CLOSESPIDER_TIMEOUT": 4,
            "LOG_LEVEL": "WARNING",
        }
        crawler = get_crawler(Pushed, settings)
        await crawler.crawl_async()
        with urlopen(f"http://127.0.0.1:{port}/_hits") as r:
            hits = {host: len(times) for host, times in json.load(r).items()}
    finally:
        harness.stop(proc)
    # a host's two downloads, and the two its slot held queued, at most (before: up to 17)
    assert hits and max(hits.values()) <= 4, sorted(hits.values())
