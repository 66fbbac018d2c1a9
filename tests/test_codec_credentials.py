"""Per-request credentials are stored (another worker redoes the request) but never printed."""

from __future__ import annotations

import json
from typing import Any

import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f

from scrapy_ha.codec import encode_request, mask_payload
from scrapy_ha.dlq import DeadLetterQueue
from tests.test_cli import crawl, scrapy_ha

SECRET = "s3cret-pw"


class AuthSpider(scrapy.Spider):
    """Logs in per request to a page that is gone (dead-lettered)."""

    name = "authpass"
    http_user = "spider-user"
    http_pass = "spider-level-pw"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base_url = base_url

    async def start(self) -> Any:
        meta = {"http_user": "alice", "http_pass": SECRET, "http_auth_domain": None}
        yield scrapy.Request(f"{self.base_url}/status/404", meta=meta, errback=self.on_error)

    def on_error(self, failure: Any) -> None:
        pass


def test_the_spider_attributes_are_never_stored_the_meta_is():
    spider = AuthSpider()
    request = scrapy.Request("http://x/", meta={"http_pass": SECRET})
    payload = encode_request(request, spider)
    assert b"spider-level-pw" not in payload and SECRET.encode() in payload


def test_mask_payload_hides_http_pass_also_in_nested_requests_and_other_meta_forms():
    doc = {
        "u": "http://x/",
        "mt": {
            "http_user": "a",
            "http_pass": SECRET,
            "next": {"__r": {"u": "http://y/", "mt": {"http_pass": SECRET}}},
        },
        "k": {"__d": [[1, 2]]},
    }
    shown = json.dumps(mask_payload(doc))
    assert SECRET not in shown and shown.count('"***"') == 2 and '"http_user": "a"' in shown
    tagged = {"u": "http://x/", "mt": {"__d": [["http_pass", SECRET], [1, "one"]]}}
    assert SECRET not in json.dumps(mask_payload(tagged))
    assert doc["mt"]["http_pass"] == SECRET  # a copy: the stored request is untouched


@deferred_f_from_coro_f
async def test_dlq_show_masks_http_pass(redis_url, site):
    await crawl(AuthSpider, redis_url, site)
    async with DeadLetterQueue.from_url(redis_url, "authpass") as dlq:
        (entry,) = await dlq.entries()
    assert entry.request["mt"]["http_pass"] == SECRET  # stored: another worker needs it
    out = scrapy_ha("--redis-url", redis_url, "dlq", "show", "authpass", entry.id).stdout
    assert SECRET not in out
    shown = json.loads(out)["request"]["mt"]
    assert shown["http_pass"] == "***" and shown["http_user"] == "alice"
