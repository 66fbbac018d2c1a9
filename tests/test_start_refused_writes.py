"""A Redis that answers but refuses writes at a worker's start is said as such."""

from __future__ import annotations

import logging

import redis
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.store.connection import down_reason
from tests import redis_servers
from tests.spiders import CatalogueSpider
from tests.test_redis_connections import crawl_settings


def test_a_scripts_error_keeps_its_words_and_a_password_stays_masked():
    """Redis names the script an error came from ("on @user_script:1."): the reason was
    replaced by "error connecting to URL", as if it held a password."""
    url = "redis://127.0.0.1:6379/0"
    for where in ("@user_script:1.", "@user_function:12."):
        said = f"NOREPLICAS Not enough good replicas to write. script: ff96, on {where}"
        reason = down_reason(redis.exceptions.ConnectionError(said), url)
        assert reason == f"ConnectionError: {said}", reason
    leaked = redis.exceptions.ConnectionError("Error 111 connecting to u:hunter2@127.0.0.1")
    assert "hunter2" not in down_reason(leaked, "redis://u:***@127.0.0.1:6379/0")


@deferred_f_from_coro_f
async def test_a_worker_started_while_writes_are_refused_says_noreplicas(tmp_path, caplog):
    """A primary left without the replica ``min-replicas-to-write`` asks for (after a
    failover) failed the start as "cannot reach Redis ... error connecting to ...": check
    that redis-server is running, when it was, and answered NOREPLICAS."""
    server = redis_servers.start(tmp_path / "redis", "--min-replicas-to-write", "1")
    try:
        url = f"redis://127.0.0.1:{server.port}/0"
        settings = crawl_settings(REDIS_URL=url, HA_CONNECT_TIMEOUT=2, HA_START_TIMEOUT=0)
        crawler = get_crawler(CatalogueSpider, settings)
        await crawler.crawl_async(base_url="http://127.0.0.1:9")
    finally:
        server.kill()
    (error,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "NOREPLICAS" in error and "error connecting to" not in error, error
