"""A CLI command through sentinels that name no primary for the service says so. A QA run
during a Sentinel failover: the error (MasterNotFoundError) ended "is redis-server running
there?", of a URL that names sentinels."""

from __future__ import annotations

from tests import redis_servers
from tests.test_cli import scrapy_ha


def test_sentinels_that_name_no_primary_are_said_to(redis_server, tmp_path):
    sentinel = redis_servers._sentinel(tmp_path / "sentinel", redis_server.port)
    try:
        url = f"redis+sentinel://127.0.0.1:{sentinel.port}/no-such-service/0"
        result = scrapy_ha("--redis-url", url, "status", "shop")
    finally:
        sentinel.kill()
    assert result.returncode == 2, result
    assert "MasterNotFoundError" in result.stderr, result.stderr
    assert "do the sentinels there name a primary for the service" in result.stderr
    assert "is redis-server running there?" not in result.stderr
