"""A Redis that asks for a password the URL does not give is said to ask for one, by a
worker and by the CLI (a QA run: both said it "refused the credentials", quoting Redis 7's
reply about HELLO, to a URL that gave none); a wrong password is still said to be refused.
A real redis-server with a password."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import redis.asyncio
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.codec import mask_url
from scrapy_ha.store.connection import RedisUnavailable, check_reachable
from tests import redis_servers
from tests.cli_seed import scrapy_ha

if TYPE_CHECKING:
    from pathlib import Path

PASSWORD = "s3cret"


@pytest.fixture
def server(tmp_path: Path):
    started = redis_servers.start(tmp_path / "redis", "--requirepass", PASSWORD, password=PASSWORD)
    yield started
    started.kill()


@deferred_f_from_coro_f
async def test_a_worker_says_redis_asks_for_a_password_the_url_does_not_give(server):
    said = {}
    for given in ("", ":wrong@"):
        url = f"redis://{given}127.0.0.1:{server.port}/0"
        client = redis.asyncio.Redis.from_url(url)
        with pytest.raises(RedisUnavailable) as refused:
            await check_reachable(client, mask_url(url), 5)  # as the worker names it
        await client.aclose()
        said[given] = str(refused.value)
    assert said[""].startswith(
        f"Redis at redis://127.0.0.1:{server.port}/0 asks for a password and none was given"
    ), said[""]
    assert said[":wrong@"].startswith(
        f"Redis at redis://:***@127.0.0.1:{server.port}/0 refused the credentials"
    ), said[":wrong@"]
    assert all("give the user name and password in REDIS_URL" in s for s in said.values())


def test_the_cli_says_redis_asks_for_a_password_the_url_does_not_give(server):
    done = scrapy_ha("status", "s", "--redis-url", f"redis://127.0.0.1:{server.port}/0")
    assert done.returncode == 2
    assert done.stderr.startswith(
        f"error: Redis at redis://127.0.0.1:{server.port}/0 asks for a password and none was given"
    ), done.stderr
    wrong = scrapy_ha("status", "s", "--redis-url", f"redis://:x@127.0.0.1:{server.port}/0")
    assert wrong.returncode == 2
    assert "refused the credentials" in wrong.stderr and ":x@" not in wrong.stderr, wrong.stderr
