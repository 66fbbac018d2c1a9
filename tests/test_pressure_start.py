"""Back-pressure at a worker's start judges Redis's memory from the INFO read at connect,
except where that INFO is older than what the crawl finds: after SCHEDULER_FLUSH_ON_START."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.keys import Keys
from tests import redis_servers
from tests.spiders import CatalogueSpider

if TYPE_CHECKING:
    from pathlib import Path

#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")

#: What an earlier run of the crawl left: flushed at the start.
LEFT_BYTES = 32 << 20


@pytest.fixture
def server(tmp_path: Path):
    server = redis_servers.start(tmp_path / "redis")
    yield server
    server.kill()


@deferred_f_from_coro_f
async def test_a_flush_on_start_is_not_held_back_by_what_it_flushed(server, site):
    client = server.client()
    empty = int(client.info("memory")["used_memory"])
    # in pieces: Redis keeps a client's query buffer as large as its largest command for a
    # while, and counts it in its memory (a flush does not free that)
    for piece in range(32):
        client.hset(Keys("ha", "catalogue").payload, f"left{piece}", b"x" * (LEFT_BYTES // 32))
    assert int(client.info("memory")["used_memory"]) > empty + LEFT_BYTES
    settings = {
        "SCHEDULER": "scrapy_ha.Scheduler",
        "REDIS_URL": f"redis://127.0.0.1:{server.port}/0",
        "HA_IDLE_TIMEOUT": 0.3,
        "SCHEDULER_FLUSH_ON_START": True,
        # above what the crawl itself takes, below what the last run left
        "HA_REDIS_MEMORY_HIGH": empty + LEFT_BYTES // 2,
        "HA_REDIS_MEMORY_LOW": empty + LEFT_BYTES // 4,
    }
    crawler = get_crawler(CatalogueSpider, settings)
    await crawler.crawl_async(base_url=site.url)
    assert not client.exists(Keys("ha", "catalogue").payload)
    assert crawler.stats.get_value("ha/backpressure/held") is None
    assert len(crawler.spider.items) == 50
    client.close()
