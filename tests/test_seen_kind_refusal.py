"""A real ``scrapy crawl`` worker whose dupefilter the crawl in Redis refuses mid-start (a
worker without ``HA_DUPEFILTER_TTL`` wrote the exact set first, both having passed the
check at start): it stops by itself with one ERROR naming the settings and the fix, exits
with 1, and leaves nothing lost: the page it held goes back to the queue."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import redis.asyncio
from scrapy import Request
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.codec import encode_request
from scrapy_ha.config.memory import MemoryConfig
from scrapy_ha.keys import Keys
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.sharding import set_dupefilter
from scrapy_ha.store.wire import NewEntry
from tests.scrapy_project import crawl, write_project

if TYPE_CHECKING:
    import subprocess
    from pathlib import Path

#: Seconds a step may make no progress before the test fails (a busy machine is slow, never
#: this slow); every wait below ends as soon as its step is done.
STALL = 60.0

SPIDER = '''
import asyncio
from pathlib import Path

import scrapy


class Waiting(scrapy.Spider):
    """Parses the page it leases, then waits for the test before yielding its links."""

    name = "waiting"

    async def start(self):
        return
        yield

    async def parse(self, response):
        Path(self.marks, "parsing").touch()
        while not Path(self.marks, "go").exists():
            await asyncio.sleep(0.02)
        for i in range(3):
            yield scrapy.Request(response.urljoin(f"/list/{i + 2}"))
'''


async def wait_for(done, proc: subprocess.Popen[bytes], what: str) -> None:
    """Wait until *done()*, while the worker runs; fail after :data:`STALL` seconds."""
    deadline = time.monotonic() + STALL
    while not done():
        assert proc.poll() is None, f"the worker ended before {what}"
        assert time.monotonic() < deadline, f"no {what} after {STALL} s"
        await asyncio.sleep(0.02)


async def exited(proc: subprocess.Popen[bytes]) -> int:
    deadline = time.monotonic() + STALL
    while proc.poll() is None:
        assert time.monotonic() < deadline, f"the refused worker still runs after {STALL} s"
        await asyncio.sleep(0.05)
    return proc.returncode


@deferred_f_from_coro_f
async def test_a_worker_refused_for_its_dupefilter_stops_and_gives_its_page_back(
    redis_url, site, tmp_path: Path
):
    keys = Keys("ha", "waiting")
    client = redis.asyncio.Redis.from_url(redis_url)
    seed = RedisQueue(client, keys)  # a page never filtered: no dupefilter is written
    assert await seed.enqueue([NewEntry(b"", 0, encode_request(Request(site.url + "/"), None))])
    marks = tmp_path / "marks"
    marks.mkdir()
    project = write_project(tmp_path / "project", "refused", SPIDER)
    log = tmp_path / "worker.log"
    settings = {"REDIS_URL": redis_url, "HA_DUPEFILTER_TTL": "60", "HA_IDLE_TIMEOUT": "1"}
    proc = crawl(project, "waiting", log, args={"marks": str(marks)}, settings=settings)
    try:
        # started (nothing in Redis refused its settings), holding the page's lease
        await wait_for((marks / "parsing").exists, proc, "page leased and parsed")
        plain = RedisQueue(client, keys)  # a worker without the TTL, started with it, of
        await client.delete(keys.filter_kind)  # an earlier version, which claims no kind
        await set_dupefilter(plain, MemoryConfig(), 0)
        url = site.url + "/list/9"
        assert await plain.enqueue([NewEntry(b"x" * 12, 0, encode_request(Request(url), None))])
        (marks / "go").touch()
        code = await exited(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text(errors="replace")
    errors = [line for line in text.splitlines() if " ERROR: " in line]
    assert len(errors) == 1, text
    assert "scrapy-ha stops this worker: this worker's HA_DUPEFILTER='set' with " in errors[0]
    assert "HA_DUPEFILTER_TTL=60 does not fit the crawl of waiting" in errors[0]
    assert "ha:{waiting}:buckets keeps the exact set for ever" in errors[0]
    assert "`scrapy-ha flush waiting`" in errors[0]
    assert "'finish_reason': 'ha_start_failed'" in text
    assert code == 1
    counts = await seed.counts()
    assert (counts.pending, counts.leased) == (2, 0), counts  # the page given back, and /list/9
    assert not await client.exists(keys.aged)  # no second dupefilter beside the buckets
    await client.aclose()
