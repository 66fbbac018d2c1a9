"""One sentinel that hangs (a host down, a frozen process) leaves time to ask the others."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import pytest
from scrapy.settings import Settings
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.store.connection import check_reachable, redis_from_settings
from tests import redis_servers
from tests.test_cli import scrapy_ha

if TYPE_CHECKING:
    from pathlib import Path


@pytest.fixture
def hung_first(tmp_path: Path):
    """A Sentinel URL whose first sentinel never answers: a socket that listens and never
    accepts (the kernel completes the handshake, as for a SIGSTOPped redis-sentinel), then
    the three sentinels of a primary and its replica."""
    found = redis_servers.start_sentinels(tmp_path)
    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen()
    ports = [hung.getsockname()[1], *(s.port for s in found.sentinels)]
    nodes = ",".join(f"127.0.0.1:{port}" for port in ports)
    yield f"redis+sentinel://{nodes}/{redis_servers.SERVICE}/0"
    hung.close()
    found.stop()


@deferred_f_from_coro_f
async def test_a_client_reaches_the_primary_past_a_sentinel_that_hangs(hung_first):
    """The first sentinel took the whole connect timeout (each sentinel was given all of
    it), so a worker's every start attempt timed out with two sentinels of three up."""
    client = redis_from_settings(Settings({"REDIS_URL": hung_first}), connect_timeout=2)
    try:
        info = await check_reachable(client, hung_first, 2)
    finally:
        await client.aclose()
    assert info["redis_version"]


def test_the_cli_reads_the_crawl_past_a_sentinel_that_hangs(hung_first):
    """It gave up within its 5 s: "cannot reach Redis ... (TimeoutError: timed out)"."""
    result = scrapy_ha("--redis-url", hung_first, "workers", "books")
    assert "no such crawl: no key of spider 'books'" in result.stderr, result.stderr
