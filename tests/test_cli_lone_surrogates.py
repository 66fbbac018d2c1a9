"""What ``scrapy-ha`` prints of a request holding a lone surrogate (a string UTF-8 cannot
hold, which the codec stores as a JSON escape): printed as that escape, never a crash."""

from __future__ import annotations

import json
from typing import Any

import pytest
import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.codec.log_masking import visible
from tests.test_dlq import cli
from tests.test_retry_crawl import FAST_RETRIES

#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")

#: a lone surrogate, as text decoded with ``surrogateescape`` or from a page's broken JSON
NOTE = "caf\udce9 \ud800 au lait"


class SurrogateSpider(scrapy.Spider):
    """One request to a 404 page (dead-lettered as ``gone``) whose meta holds NOTE."""

    name = "surrogates"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base_url = base_url

    async def start(self) -> Any:
        yield scrapy.Request(f"{self.base_url}/status/404", meta={"note": NOTE})


@deferred_f_from_coro_f
async def test_dlq_show_prints_a_lone_surrogate_as_its_json_escape(redis_url, site):
    crawler = get_crawler(SurrogateSpider, {**FAST_RETRIES, "REDIS_URL": redis_url})
    await crawler.crawl_async(base_url=site.url)
    assert crawler.stats.get_value("ha/dead/gone") == 1
    listed = cli(redis_url, "dlq", "export", "surrogates")
    assert listed.returncode == 0, listed.stderr
    entry_id = json.loads(listed.stdout)["id"]
    shown = cli(redis_url, "dlq", "show", "surrogates", entry_id)
    assert shown.returncode == 0, shown.stderr
    assert "Traceback" not in shown.stderr
    assert json.loads(shown.stdout)["request"]["mt"]["note"] == NOTE  # the value, read back


def test_visible_escapes_lone_surrogates_only():
    assert visible(NOTE) == "caf\\udce9 \\ud800 au lait"
    assert visible("café 😀") == "café 😀"
    assert json.loads(f'"{visible(NOTE)}"') == NOTE
