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
from scrapy_ha.codec.masking import mask_body
from tests.test_dlq import cli
from tests.test_retry_crawl import FAST_RETRIES

#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")

#: a lone surrogate, as text decoded with ``surrogateescape`` or from a page's broken JSON
NOTE = "caf\udce9 \ud800 au lait"


class SurrogateSpider(scrapy.Spider):
    """Requests to be dead-lettered holding NOTE: in meta, and in a JSON body with a
    password (which ``dlq show`` masks)."""

    name = "surrogates"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base_url = base_url

    async def start(self) -> Any:
        yield scrapy.Request(f"{self.base_url}/status/404", meta={"note": NOTE})
        body = {"password": "hunter2", "note": NOTE}
        yield scrapy.http.JsonRequest(f"{self.base_url}/status/410", data=body)


@deferred_f_from_coro_f
async def test_dlq_show_prints_a_lone_surrogate_as_its_json_escape(redis_url, site):
    crawler = get_crawler(SurrogateSpider, {**FAST_RETRIES, "REDIS_URL": redis_url})
    await crawler.crawl_async(base_url=site.url)
    assert crawler.stats.get_value("ha/dead/gone") == 1  # the POST: 405, class client
    listed = cli(redis_url, "dlq", "export", "surrogates")
    assert listed.returncode == 0, listed.stderr
    ids = {e["url"][-3:]: e["id"] for e in map(json.loads, listed.stdout.splitlines())}
    assert sorted(ids) == ["404", "410"]
    shown = cli(redis_url, "dlq", "show", "surrogates", ids["404"])
    assert shown.returncode == 0, shown.stderr
    assert "Traceback" not in shown.stderr
    assert json.loads(shown.stdout)["request"]["mt"]["note"] == NOTE  # the value, read back
    shown = cli(redis_url, "dlq", "show", "surrogates", ids["410"])
    assert shown.returncode == 0, shown.stderr
    assert "hunter2" not in shown.stdout and NOTE[:3] in shown.stdout


def test_visible_escapes_lone_surrogates_only():
    assert visible(NOTE) == "caf\\udce9 \\ud800 au lait"
    assert visible("café 😀") == "café 😀"
    assert json.loads(f'"{visible(NOTE)}"') == NOTE


def test_a_masked_json_body_keeps_a_lone_surrogate_as_its_escape():
    raw = json.dumps({"password": "hunter2", "note": NOTE}).encode()
    masked = mask_body(raw)
    assert json.loads(masked) == {"password": "***", "note": NOTE}
