"""The ERROR for a request that cannot be stored advises ``HA_UNSTORABLE = "drop-key"`` only
where that setting would store it: an unstorable ``meta``/``cb_kwargs`` value under
``"error"``; not for a payload over the size limit, a callback that is no spider method or an
unstorable attribute of a Request subclass (refused whole whatever the setting), and never to
a crawl that runs with ``"drop-key"`` already."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import scrapy
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.test import get_crawler

from scrapy_ha.codec import CodecError, encode_request
from scrapy_ha.codec.document import MAX_PAYLOAD_BYTES
from tests.spiders import CatalogueSpider

#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")

ADVICE = "set HA_UNSTORABLE"


class TaggedRequest(scrapy.Request):
    attributes = (*scrapy.Request.attributes, "tag")

    def __init__(self, *args: Any, tag: Any = None, **kwargs: Any) -> None:
        self.tag = tag
        super().__init__(*args, **kwargs)


def helper(response: Any) -> None:
    """A callback that is not a method of the spider."""


class RefusedSpider(CatalogueSpider):
    """Start requests no setting lets the queue store, a storable one, and (``meta_too``)
    one whose meta value ``"drop-key"`` would leave out."""

    name = "refused_advice"

    def __init__(self, meta_too: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.meta_too = meta_too

    async def start(self) -> Any:
        base = self.start_urls[0].replace("/list/1", "")
        big = "x" * (MAX_PAYLOAD_BYTES + 1)
        yield scrapy.Request(f"{base}/item/1", callback=self.parse_item, meta={"big": big})
        yield scrapy.Request(f"{base}/item/2", callback=helper)
        yield TaggedRequest(f"{base}/item/3", callback=self.parse_item, tag=object())
        yield scrapy.Request(f"{base}/item/4", callback=self.parse_item)
        if self.meta_too:
            yield scrapy.Request(f"{base}/item/5", callback=self.parse_item, meta={"o": object()})


def settings(redis_url: str, **extra: Any) -> dict[str, Any]:
    return {
        "ADDONS": {"scrapy_ha.Addon": 0},
        "REDIS_URL": redis_url,
        "HA_IDLE_TIMEOUT": 0.3,
        **extra,
    }


def refusals(caplog: Any) -> dict[str, str]:
    """The 'Cannot store' ERROR of each refused item path: its message."""
    found = {}
    for record in caplog.records:
        if record.levelno >= logging.ERROR and "Cannot store" in record.message:
            path = record.message.split("/item/")[1].split(">")[0]
            found[path] = record.message
    return found


@pytest.mark.parametrize("policy", ["error", "drop-key"])
@deferred_f_from_coro_f
async def test_drop_key_is_not_advised_where_it_stores_nothing(redis_url, site, caplog, policy):
    crawler = get_crawler(RefusedSpider, settings(redis_url, HA_UNSTORABLE=policy))
    with caplog.at_level(logging.ERROR):
        await crawler.crawl_async(base_url=site.url)
    assert [i["id"] for i in crawler.spider.items] == [4]
    logged = refusals(caplog)
    assert sorted(logged) == ["1", "2", "3"]
    assert "MAX_PAYLOAD_BYTES" in logged["1"]
    assert "not a method of the spider" in logged["2"]
    assert "builtins.object" in logged["3"]
    advised = sorted(path for path, message in logged.items() if ADVICE in message)
    assert advised == []


@deferred_f_from_coro_f
async def test_drop_key_is_advised_for_an_unstorable_meta_value(redis_url, site, caplog):
    crawler = get_crawler(RefusedSpider, settings(redis_url))
    with caplog.at_level(logging.ERROR):
        await crawler.crawl_async(base_url=site.url, meta_too=True)
    logged = refusals(caplog)
    assert sorted(logged) == ["1", "2", "3", "5"]
    assert "meta['o'] is of type builtins.object" in logged["5"]
    assert logged["5"].count("drop-key") == 1  # said once, not twice


def test_an_unstorable_attribute_names_itself_as_one():
    request = TaggedRequest("https://example.com/t", tag=object())
    with pytest.raises(CodecError) as info:
        encode_request(request, None, unstorable="error")
    message = str(info.value)
    assert "TaggedRequest.tag is of type builtins.object" in message
    assert ADVICE not in message


def test_a_value_that_refers_to_itself_is_named_with_its_key():
    loop: dict[str, Any] = {}
    loop["me"] = loop
    request = scrapy.Request("https://example.com/c", meta={"ok": 1, "loop": loop})
    with pytest.raises(CodecError) as info:
        encode_request(request, None, unstorable="error")
    message = str(info.value)
    assert "meta['loop'] is nested too deeply (or refers to itself)" in message
    assert message.count("drop-key") == 1  # which leaves that key out
    kept = encode_request(request, None, unstorable="drop-key")
    assert b'"ok":1' in kept and b"loop" not in kept
