"""The dead-letter queue's documented Python example, run as it is written (in its own
process, as a user runs a script) against dead letters of a real crawl."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.keys import Keys
from tests import backqueues
from tests.spiders import FaultSpider
from tests.test_retry_crawl import FAST_RETRIES

ROOT = Path(__file__).resolve().parent.parent
#: What the example names that differs here: the Redis, and the host of the dead requests.
DOCUMENTED_REDIS = '"redis://localhost:6379/0"'
DOCUMENTED_DOMAIN = '"example.com"'


#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


class BooksSpider(FaultSpider):
    name = "books"


def documented_example() -> str:
    """The Python block of docs/reference.md that uses ``DeadLetterQueue.from_url``."""
    text = (ROOT / "docs" / "reference.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    (example,) = [b for b in blocks if "DeadLetterQueue.from_url" in b]
    return example


@deferred_f_from_coro_f
async def test_the_documented_example_lists_and_requeues_what_is_gone(
    redis_url, redis_client, site, tmp_path
):
    paths = ("/status/404?a", "/status/410", "/flaky/2?fail=9&status=503")
    crawler = get_crawler(BooksSpider, {**FAST_RETRIES, "REDIS_URL": redis_url})
    await crawler.crawl_async(base_url=site.url, paths=paths)
    keys = Keys("ha", "books")
    assert redis_client.zcard(keys.dead) == 3

    example = documented_example()
    assert DOCUMENTED_REDIS in example and DOCUMENTED_DOMAIN in example
    script = example.replace(DOCUMENTED_REDIS, repr(redis_url)).replace(
        DOCUMENTED_DOMAIN, '"127.0.0.1"'
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    *listed, total = done.stdout.splitlines()
    assert total == "requeued 2"
    assert sorted(line.split()[1:3] for line in listed) == [
        ["GET", site.url + "/status/404?a"],
        ["GET", site.url + "/status/410"],
    ]
    assert backqueues.count(redis_client, keys) == 2
    assert redis_client.zcard(keys.dead) == 1  # the server error stays
