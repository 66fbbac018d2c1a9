"""``scrapy-ha push``: requests added from the shell are crawled by a real worker with their
callback, errback, meta and priority, through the crawl's own dupefilter."""

from __future__ import annotations

import json
from typing import Any

import pytest
import scrapy
from scrapy.core.engine import ExecutionEngine
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.cli.push import BadLine, parse_line
from tests.cli_seed import scrapy_ha
from tests.test_retry_crawl import FAST_RETRIES


class PushedSpider(scrapy.Spider):
    """No start requests of its own: it crawls what an operator pushed."""

    name = "pushed"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seen: list[tuple[str, str, Any]] = []

    async def start(self) -> Any:
        return
        yield

    def parse(self, response: Any) -> None:
        self.seen.append(("parse", response.url, response.meta.get("tag")))

    def parse_item(self, response: Any) -> None:
        self.seen.append(("parse_item", response.url, response.meta.get("tag")))

    def on_error(self, failure: Any) -> None:
        self.seen.append(("on_error", failure.request.url, failure.request.meta.get("tag")))


def push(redis_url: str, *requests: str, stdin: str | None = None) -> Any:
    kwargs: dict[str, Any] = {"input": stdin, "stdin": None} if stdin is not None else {}
    return scrapy_ha("push", "pushed", *requests, "--redis-url", redis_url, **kwargs)


@deferred_f_from_coro_f
async def test_pushed_requests_are_crawled_with_their_callbacks_and_meta(
    redis_url, redis_client, site, monkeypatch
):
    monkeypatch.setattr(ExecutionEngine, "_SLOT_HEARTBEAT_INTERVAL", 0.2)
    item = json.dumps({"url": f"{site.url}/item/2", "callback": "parse_item", "meta": {"tag": "x"}})
    gone = json.dumps({"url": f"{site.url}/status/404", "errback": "on_error", "priority": 3})
    first = push(redis_url, f"{site.url}/item/1", item, gone)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "pushed 3 requests to pushed: 3 added, 0 filtered (seen before)"
    again = "\n".join(
        [f"{site.url}/item/1", item, json.dumps({"url": f"{site.url}/item/1", "dont_filter": True})]
    )
    second = push(redis_url, "-", stdin=again + "\n")
    assert second.stdout.strip() == "pushed 3 requests to pushed: 1 added, 2 filtered (seen before)"
    assert redis_client.zcard("ha:{pushed}:pending") == 4

    crawler = get_crawler(PushedSpider, {**FAST_RETRIES, "REDIS_URL": redis_url})
    await crawler.crawl_async()
    assert sorted(crawler.spider.seen) == sorted(
        [
            ("parse", f"{site.url}/item/1", None),
            ("parse", f"{site.url}/item/1", None),
            ("parse_item", f"{site.url}/item/2", "x"),
            ("on_error", f"{site.url}/status/404", None),
        ]
    )


BAD_LINES = [
    ('{"url": "http://a.example/x", "callback": "os.system"}', "callback='os.system'"),
    ('{"url": "http://a.example/x", "callback": "_set_crawler"}', "not starting with '_'"),
    ('{"url": "http://a.example/x", "colour": "red"}', "unknown field(s) colour"),
    ('{"url": 5}', 'needs a "url"'),
    ("{not json", "not JSON"),
    ("a.example/x", "Missing scheme"),
]


@pytest.mark.parametrize(("line", "says"), BAD_LINES)
def test_a_bad_line_is_named_with_what_to_fix(line, says):
    with pytest.raises(BadLine) as bad:
        parse_line(line, "stdin line 3")
    assert str(bad.value).startswith("stdin line 3: ") and says in str(bad.value)


def test_a_bad_line_pushes_nothing(redis_url, redis_client):
    result = push(redis_url, "http://a.example/fine", BAD_LINES[0][0])
    assert result.returncode == 1
    said = result.stderr.splitlines()  # after a note that no project settings apply here
    assert said[-1].startswith("nothing pushed: argument 2: callback='os.system'")
    assert not redis_client.exists("ha:{pushed}:pending", "ha:{pushed}:dupefilter")
