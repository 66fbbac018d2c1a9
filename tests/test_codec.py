"""The request codec: exact round trips, no credentials stored, clear errors."""

from __future__ import annotations

import json

import pytest
import scrapy
from scrapy.http import FormRequest, JsonRequest

from scrapy_ha.codec import CodecError, decode_request, encode_request, mask_url


class Spider(scrapy.Spider):
    name = "codec"

    def parse_item(self, response):  # pragma: no cover - only referenced
        pass

    def on_error(self, failure):  # pragma: no cover
        pass


SPIDER = Spider()


def roundtrip(request: scrapy.Request) -> scrapy.Request:
    return decode_request(encode_request(request, SPIDER), SPIDER)


def test_every_field_round_trips_exactly():
    request = scrapy.Request(
        "https://example.com/a?b=1", callback=SPIDER.parse_item, errback=SPIDER.on_error,
        method="POST", body=b"\x00\xffbinary", headers={"X-Bin": b"\xfe", "Accept": ["a", "b"]},
        cookies={"c": "1"}, meta={"bytes": b"\x01", "tuple": (1, "x"), "nested": {"k": [b"v"]},
                                   "int_keys": {1: "one"}, "depth": 3, "__weird": 1},
        encoding="latin-1", priority=7, dont_filter=True, flags=["f"], cb_kwargs={"page": 2},
    )  # fmt: skip
    copy = roundtrip(request)
    assert copy.to_dict(spider=SPIDER) == request.to_dict(spider=SPIDER)
    assert copy.callback == SPIDER.parse_item and copy.errback == SPIDER.on_error


def test_a_plain_request_is_small():
    payload = encode_request(scrapy.Request("http://127.0.0.1:8000/item/12345"), SPIDER)
    assert payload == b'{"v":1,"u":"http://127.0.0.1:8000/item/12345"}'


@pytest.mark.filterwarnings("ignore:scrapy.http.FormRequest is deprecated")
@pytest.mark.parametrize("cls", [FormRequest, JsonRequest])
def test_request_subclasses_round_trip(cls):
    request = cls("https://example.com/form", method="POST", body=b"a=1")
    copy = roundtrip(request)
    assert type(copy) is cls
    assert copy.body == request.body


def test_proxy_credentials_are_never_stored():
    request = scrapy.Request(
        "https://example.com",
        headers={"Proxy-Authorization": "Basic dXNlcjpzZWNyZXQ="},
        meta={"proxy": "http://user:secret@proxy:8000", "_auth_proxy": "http://proxy:8000"},
    )
    payload = encode_request(request, SPIDER)
    assert b"secret" not in payload and b"dXNlcjpzZWNyZXQ" not in payload
    assert roundtrip(request).meta == {"proxy": "http://proxy:8000"}
    assert request.meta["proxy"] == "http://user:secret@proxy:8000"  # the original is untouched


def test_a_callback_that_is_not_a_spider_method_fails_naming_url_and_field():
    with pytest.raises(CodecError, match=r"https://example.com/x.*callback.*not a method"):
        encode_request(scrapy.Request("https://example.com/x", callback=lambda r: None), SPIDER)


def test_unencodable_meta_fails_naming_url_and_field():
    request = scrapy.Request("https://example.com/y", meta={"when": object()})
    with pytest.raises(CodecError, match=r"https://example.com/y: meta\['when'\].*object"):
        encode_request(request, SPIDER)


@pytest.mark.parametrize(
    "payload",
    [b"\x80\x04pickle", b"{}", b'{"v": 99, "u": "http://x"}', b"[1]",
     json.dumps({"v": 1, "u": "http://x", "cb": "no_such_method"}).encode()],
)  # fmt: skip
def test_a_corrupt_payload_is_a_codec_error(payload):
    with pytest.raises(CodecError):
        decode_request(payload, SPIDER)


def test_mask_url():
    assert mask_url("redis://:s3cret@host:6379/0") == "redis://:***@host:6379/0"
    assert mask_url("redis://user:s3cret@host/1") == "redis://user:***@host/1"
    assert mask_url("redis://host:6379") == "redis://host:6379"
