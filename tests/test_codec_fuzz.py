"""Fuzzing the decoder: whatever a payload holds, decoding returns a Request or raises
CodecError (the scheduler dead-letters it as corrupt), never any other exception."""

from __future__ import annotations

import datetime
import json
import sys
from decimal import Decimal

import scrapy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scrapy.http import JsonRequest

from scrapy_ha.codec import CodecError, decode_request, encode_request
from tests.test_codec import SPIDER, Color, Offer, Product

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))

TAGS = [
    "__b",
    "__t",
    "__d",
    "__s",
    "__fs",
    "__dt",
    "__da",
    "__tm",
    "__td",
    "__dc",
    "__u",
    "__e",
    "__i",
    "__r",
    "__x",
]
FIELDS = ["v", "u", "m", "b", "c", "mt", "e", "p", "df", "f", "k", "h", "cls", "x", "cb", "eb"]
NAMES = [
    "tests.test_codec:Product",
    "tests.test_codec:Offer",
    "tests.test_codec:Color",
    "scrapy.http:JsonRequest",
    "scrapy.http.request.form.FormRequest",
    "builtins:dict",
    "os:system",
    "parse_item",
    "on_error",
    "name",
    "RED",
    "http://x",
    "QQ==",
    "2026-01-01",
]

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=8)
    | st.sampled_from(NAMES)
)
keys = st.sampled_from(TAGS + FIELDS) | st.text(max_size=5)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=25,
)


def decodes_or_codec_error(raw: bytes) -> None:
    try:
        request = decode_request(raw, SPIDER)
    except CodecError:
        return
    assert isinstance(request, scrapy.Request)


@FUZZ
@given(json_values)
def test_any_json_value_decodes_or_is_a_codec_error(value):
    decodes_or_codec_error(json.dumps(value).encode())


@FUZZ
@given(st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6))
def test_any_document_of_known_fields_decodes_or_is_a_codec_error(doc):
    decodes_or_codec_error(json.dumps({"v": 1, "u": "http://x", **doc}).encode())


def valid_doc() -> dict:
    inner = scrapy.Request("https://example.com/n", callback=SPIDER.parse_item, meta={"s": {1, 2}})
    request = JsonRequest(
        "https://example.com/api",
        data={"a": 1},
        callback=SPIDER.parse_item,
        meta={
            "item": Product(name="x", price=Decimal("1.5")),
            "when": datetime.datetime(2026, 1, 1),
            "offer": Offer("s", Decimal(2)),
            "color": Color.RED,
            "next": inner,
            (1, 2): b"\x00",
        },
        cb_kwargs={"tags": frozenset({"a"}), "d": datetime.timedelta(seconds=3)},
        priority=2,
    )
    return json.loads(encode_request(request, SPIDER))


VALID = valid_doc()


def paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from paths(v, (*prefix, i))


ALL_PATHS = [p for p in paths(VALID) if p]


def replaced(doc, path, value):
    doc = json.loads(json.dumps(doc))
    node = doc
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return doc


def test_the_valid_payload_decodes():
    assert decode_request(json.dumps(VALID).encode(), SPIDER).meta["item"]["name"] == "x"


@FUZZ
@given(st.sampled_from(ALL_PATHS), json_values)
def test_a_valid_payload_with_any_part_replaced_decodes_or_is_a_codec_error(path, value):
    decodes_or_codec_error(json.dumps(replaced(VALID, path, value)).encode())


@FUZZ
@given(st.binary(min_size=1, max_size=4), st.integers(min_value=0))
def test_a_valid_payload_with_bytes_changed_decodes_or_is_a_codec_error(junk, where):
    raw = json.dumps(VALID).encode()
    at = where % len(raw)
    decodes_or_codec_error(raw[:at] + junk + raw[at + len(junk) :])


def test_fuzzing_imported_nothing_new():
    assert "antigravity" not in sys.modules


hashables = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text()
    | st.binary(max_size=8)
    | st.floats(allow_nan=False)
    | st.decimals(allow_nan=False)
    | st.uuids()
    | st.dates()
    | st.datetimes(timezones=st.none() | st.timezones())
    | st.times()
    | st.timedeltas()
    | st.sampled_from(Color),
    lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3),
    max_leaves=6,
)
storable = st.recursive(
    hashables,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.sets(hashables, max_size=3)
        | st.dictionaries(hashables, inner, max_size=3)
        | st.dictionaries(st.text(), inner, max_size=3)
    ),
    max_leaves=12,
)


@FUZZ
@given(storable)
def test_any_storable_value_round_trips_with_its_types(value):
    from tests.test_codec import same

    request = scrapy.Request("https://example.com", meta={"v": value}, cb_kwargs={"v": value})
    copy = decode_request(encode_request(request, SPIDER), SPIDER)
    assert same(copy.meta["v"], value) and same(copy.cb_kwargs["v"], value)
