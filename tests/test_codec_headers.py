"""A stored request's headers read directly (``decode._headers``): exactly what the general
reader (``untag``) makes of them, or its error, and only header names and Referers
remembered."""

from __future__ import annotations

import base64
import binascii
import json

import pytest
import scrapy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scrapy_ha.codec import CodecError, decode_request, encode_request
from scrapy_ha.codec import decode as codec_decode
from scrapy_ha.codec.decode import _headers, untag
from tests.test_codec import SPIDER


def tag(data: bytes) -> dict[str, str]:
    return {"__b": base64.b64encode(data).decode()}


def stored(headers: dict[str, list[bytes]]) -> object:
    """The headers as a request with them stores them."""
    request = scrapy.Request("http://h.example/", headers=headers)
    return json.loads(encode_request(request, SPIDER)).get("h", {"__d": []})


def same_outcome(value: object) -> None:
    """``_headers`` gives what ``untag`` gives, or raises what it raises."""
    try:
        expected = untag(value, SPIDER)
    except Exception as exc:  # noqa: BLE001 - compared below
        with pytest.raises(type(exc)) as raised:
            _headers(value, SPIDER)
        assert str(raised.value) == str(exc)
        return
    assert _headers(value, SPIDER) == expected


names = st.sampled_from(["Referer", "Accept", "X-Token", "Content-Type", "Cookie", "X-\u00e9"])
header_values = st.lists(st.binary(max_size=40).filter(lambda b: b.strip() == b), max_size=3)


@given(st.dictionaries(names, header_values, max_size=5))
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
def test_stored_headers_are_read_as_the_general_reader_reads_them(headers):
    value = stored(headers)
    same_outcome(value)
    with pytest.MonkeyPatch.context() as mp:  # what the writer writes is read directly
        mp.setattr(codec_decode, "untag", lambda *args: pytest.fail("read by untag"))
        _headers(value, SPIDER)


MALFORMED = {
    "not a dict": [[tag(b"A"), [tag(b"b")]]],
    "two keys": {"__d": [], "x": 1},
    "pairs not a list": {"__d": {"a": 1}},
    "pair of three": {"__d": [[tag(b"A"), [tag(b"b")], 1]]},
    "values not a list": {"__d": [[tag(b"A"), tag(b"b")]]},
    "name a string": {"__d": [["A", [tag(b"b")]]]},
    "value a string": {"__d": [[tag(b"A"), ["b"]]]},
    "value a number": {"__d": [[tag(b"Referer"), [1]]]},
    "bad base64 name": {"__d": [[{"__b": "!!"}, [tag(b"b")]]]},
    "bad base64 value": {"__d": [[tag(b"A"), [{"__b": "a"}]]]},
    "bad base64 referer": {"__d": [[tag(b"Referer"), [{"__b": "a="}]]]},
    "tag holds a number": {"__d": [[{"__b": 3}, [tag(b"b")]]]},
    "unknown tag": {"__d": [[{"__zz": "x"}, [tag(b"b")]]]},
    "a tuple name": {"__d": [[{"__t": ["a"]}, [tag(b"b")]]]},
    "nine names": {"__d": [[tag(b"N%d" % i), [tag(b"v")]] for i in range(9)]},
    "a name twice": {"__d": [[tag(b"A"), [tag(b"1")]], [tag(b"A"), [tag(b"2")]]]},
    "plain dict": {"Accept": ["x"]},
    # untag stops at the first value it cannot read: its error, not a later value's
    "an unknown tag then bad base64": {"__d": [[tag(b"A"), [{"__zz": 1}, {"__b": "a"}]]]},
    "a string then bad base64": {"__d": [[tag(b"Referer"), ["x", {"__b": "a"}]]]},
    "a bad date then bad base64": {"__d": [[tag(b"A"), [{"__dt": 5}, {"__b": "a"}]]]},
}


@pytest.mark.parametrize("value", list(MALFORMED.values()), ids=list(MALFORMED))
def test_headers_the_writer_never_writes_are_read_or_refused_as_before(value):
    same_outcome(value)


def test_a_request_with_bad_headers_is_still_refused_as_corrupt():
    doc = {"v": 1, "u": "http://h.example/", "h": {"__d": [[{"__b": "!!"}, [tag(b"b")]]]}}
    with pytest.raises(CodecError, match=r"cannot rebuild the request for http://h\.example/"):
        decode_request(json.dumps(doc), SPIDER)
    with pytest.raises(binascii.Error):
        untag(doc["h"], SPIDER)


def test_only_header_names_and_referers_are_remembered(monkeypatch):
    monkeypatch.setattr(codec_decode, "_UNTAGGED", {})
    request = scrapy.Request(
        "http://h.example/",
        headers={"Referer": "http://h.example/list", "Authorization": "Bearer secret-token"},
    )
    back = decode_request(encode_request(request, SPIDER), SPIDER)
    assert back.headers.getlist("Authorization") == [b"Bearer secret-token"]
    remembered = set(codec_decode._UNTAGGED.values())
    assert remembered == {b"Referer", b"Authorization", b"http://h.example/list"}
