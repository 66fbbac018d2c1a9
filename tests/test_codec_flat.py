"""A flat request's stored form written directly (scrapy_ha/codec/flat.py): byte for byte
what the document's encoder writes, on a corpus of requests and on random ones; anything
that is not flat is left to that encoder."""

from __future__ import annotations

import json

import pytest
import scrapy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scrapy.http import FormRequest, JsonRequest

from scrapy_ha import metakeys
from scrapy_ha.codec import CodecError, encode_request, flat
from scrapy_ha.codec.document import FORMAT_VERSION, MAX_DEPTH, MAX_PAYLOAD_BYTES, VERSION
from scrapy_ha.codec.encode import _encode_doc, stored_bytes
from scrapy_ha.codec.flat import _LAZY, FLAT_DEPTH, flat_payload
from tests.test_codec import SPIDER

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))


def by_document(request: scrapy.Request) -> bytes:
    """*request* as the document's encoder writes it (encode_request's other way)."""
    return stored_bytes({VERSION: FORMAT_VERSION, **_encode_doc(request, SPIDER, "error")})


def both(make) -> tuple[bytes | None, bytes]:
    """The flat form of a request made by *make*, and the document's form of another made
    alike (reading a field through Scrapy's property makes it: each way gets its own)."""
    return flat_payload(make(), SPIDER), by_document(make())


ODD_TEXT = [
    "plain",
    'a "quoted" \\ back\\slash',
    "tab\tnew\nline\rcr\x00nul\x1funit\x7fdel",
    "\u2028\u2029 separators",
    "é à ü ΑΘΗΝΑ 中文 😀",
    "</script><!--",
    "",
    " ",
    "__not_a_tag",
]
#: Keys of a flat dict (one starting with "__" makes it a tagged dict).
KEYS = [text for text in ODD_TEXT if not text.startswith("__")]
ODD_SCALARS = [
    0,
    -1,
    2**63,
    -(2**100),
    True,
    False,
    None,
    0.0,
    -0.0,
    1.5,
    1e-7,
    1e22,
    3.141592653589793,
    float("nan"),
    float("inf"),
    float("-inf"),
    *ODD_TEXT,
]
URLS = [
    "http://127.0.0.1:8000/item/12345",
    "https://Shop.Example:8443/a/b?q=1&r=é#frag",
    "http://[::1]:6800/x",
    'http://h.example/"quoted"\\',
    "https://bücher.example/straße?ä=ö",
    "http://h.example/%E2%82%AC",
    "http://user:pw@h.example/",
]

FLAT = {
    "plain": lambda url: scrapy.Request(url),
    "callback": lambda url: scrapy.Request(url, callback=SPIDER.parse_item),
    "both callbacks": lambda url: scrapy.Request(
        url, callback=SPIDER.parse_item, errback=SPIDER.on_error
    ),
    "private callback": lambda url: scrapy.Request(url, callback=SPIDER._private_parse),
    "referer": lambda url: scrapy.Request(url, headers={"Referer": "http://h.example/list"}),
    "referer, lower case": lambda url: scrapy.Request(url, headers={"referer": b"r\xfe"}),
    "referer, two values": lambda url: scrapy.Request(url, headers={"Referer": ["a", "b"]}),
    "headers": lambda url: scrapy.Request(
        url, headers={"Accept": ["a", "b"], "X-Bin": b"\xfe\x00", "Empty": ""}
    ),
    "proxy authorization": lambda url: scrapy.Request(
        url, headers={"Proxy-Authorization": "Basic eDp5", "Referer": "r"}
    ),
    "only proxy authorization": lambda url: scrapy.Request(
        url, headers={"Proxy-Authorization": "Basic eDp5"}
    ),
    "post": lambda url: scrapy.Request(url, method="POST", body=b'{"a": 1}\xff'),
    "method": lambda url: scrapy.Request(url, method="PUT"),
    "encoding": lambda url: scrapy.Request(url, encoding="latin-1"),
    "priority": lambda url: scrapy.Request(url, priority=-7),
    "high priority": lambda url: scrapy.Request(url, priority=2**40),
    "dont_filter": lambda url: scrapy.Request(url, dont_filter=True),
    "depth": lambda url: scrapy.Request(url, meta={"depth": 3}),
    "scalars": lambda url: scrapy.Request(
        url,
        meta={f"k{i}": v for i, v in enumerate(ODD_SCALARS)},
        cb_kwargs={text or "empty": v for text, v in zip(KEYS, ODD_SCALARS, strict=False)},
    ),
    "meta keys": lambda url: scrapy.Request(url, meta={text: 1 for text in KEYS}),
    "proxy": lambda url: scrapy.Request(
        url, meta={"proxy": "http://user:secret@proxy.example:8080", "depth": 1}
    ),
    "proxy from environment": lambda url: scrapy.Request(
        url, meta={"proxy": "http://p.example:3128", "_scheme_proxy": True, "x": 1}
    ),
    "download slot": lambda url: scrapy.Request(
        url, meta={"download_slot": "mine", "download_timeout": 12.5}
    ),
    "per-attempt keys": lambda url: scrapy.Request(
        url, meta={"_auth_proxy": "x", "retry_times": 2, "depth": 1}
    ),
    # the add-on's ParentLeaseMiddleware: a page's child carries the page's lease (a tuple,
    # never stored); a leased request its own
    "a page's child": lambda url: scrapy.Request(
        url, meta={"depth": 1, metakeys.PARENT: ("17", "9f3a")}
    ),
    "leased": lambda url: scrapy.Request(url, meta={metakeys.LEASE: ("17", "9f3a"), "d": 1}),
    "everything": lambda url: scrapy.Request(
        url,
        callback=SPIDER.parse_item,
        errback=SPIDER.on_error,
        method="POST",
        body=b"x=1",
        headers={"Referer": "r", "Content-Type": "application/x-www-form-urlencoded"},
        meta={"depth": 2, "page": "2"},
        encoding="utf-16",
        priority=5,
        dont_filter=True,
        cb_kwargs={"page": 2},
    ),
}

NOT_FLAT = {
    "nested meta": lambda url: scrapy.Request(url, meta={"list": [1, 2]}),
    "tagged key": lambda url: scrapy.Request(url, meta={"__b": 1}),
    "int key": lambda url: scrapy.Request(url, cb_kwargs={"k": {1: 2}}),
    "bytes in meta": lambda url: scrapy.Request(url, meta={"b": b"x"}),
    "bool subclass-free int": lambda url: scrapy.Request(url, meta={"i": SmallInt(3)}),
    "cookies": lambda url: scrapy.Request(url, cookies={"c": "1"}),
    "cookie list": lambda url: scrapy.Request(url, cookies=[{"name": "c", "value": "1"}]),
    "flags": lambda url: scrapy.Request(url, flags=["f"]),
    "empty cookie list set": lambda url: with_fields(url, cookies=[]),
    "empty flags tuple set": lambda url: with_fields(url, flags=()),
    "form": lambda url: FormRequest(url, formdata={"a": "1"}),
    "json": lambda url: JsonRequest(url, data={"a": 1}),
    "bool priority": lambda url: scrapy.Request(url, priority=True),
    "surrogate": lambda url: scrapy.Request(url, meta={"s": "\ud800"}),
}


class SmallInt(int):
    pass


def with_fields(url: str, **fields) -> scrapy.Request:
    """A request whose fields were set after it was made (Scrapy's setters keep them)."""
    request = scrapy.Request(url)
    for name, value in fields.items():
        setattr(request, name, value)
    return request


@pytest.mark.parametrize("url", URLS)
@pytest.mark.parametrize("make", list(FLAT.values()), ids=list(FLAT))
def test_a_flat_request_is_written_as_its_document_is(make, url):
    flat, document = both(lambda: make(url))
    assert flat is not None
    assert flat == document
    assert encode_request(make(url), SPIDER) == document


@pytest.mark.filterwarnings("ignore:scrapy.http.FormRequest is deprecated")  # (Scrapy 2.16)
@pytest.mark.parametrize("make", list(NOT_FLAT.values()), ids=list(NOT_FLAT))
def test_what_is_not_flat_is_left_to_the_documents_encoder(make):
    url = URLS[1]
    assert flat_payload(make(url), SPIDER) is None
    payload = encode_request(make(url), SPIDER)
    assert payload == by_document(make(url))


def test_a_callback_that_is_not_a_spider_method_fails_as_before():
    request = scrapy.Request("http://h.example/", callback=lambda response: None)
    assert flat_payload(request, SPIDER) is None
    with pytest.raises(CodecError, match="is not a method of the spider"):
        encode_request(request, SPIDER)


@pytest.mark.parametrize(
    "fields",
    [
        {"meta": {"item": {"a": 1}}},
        {"meta": {"redirect_urls": ["http://h.example/"]}},
        {"cb_kwargs": {"pages": [1, 2]}},
    ],
    ids=["item-in-meta", "list-in-meta", "list-in-cb-kwargs"],
)
def test_a_request_not_flat_is_given_up_before_its_callbacks_and_headers(monkeypatch, fields):
    """The document's encoder reads them again: a request that is not flat pays for them
    once, as before the flat path."""
    read: list[str] = []
    monkeypatch.setattr(flat, "_callbacks", lambda *args: read.append("callbacks"))
    monkeypatch.setattr(flat, "clean_headers", lambda *args: read.append("headers"))
    request = scrapy.Request(
        "http://h.example/", callback=SPIDER.parse_item, headers={"Referer": "x"}, **fields
    )
    assert flat_payload(request, SPIDER) is None
    assert read == []


@pytest.mark.skipif(not _LAZY, reason="this Scrapy makes a request's fields at once")
def test_storing_a_plain_request_makes_none_of_its_fields():
    request = scrapy.Request("http://h.example/", callback=SPIDER.parse_item)
    encode_request(request, SPIDER)
    made = [request._headers, request._cookies, request._meta, request._flags]
    assert made + [request._cb_kwargs] == [None] * 5


scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
flat_dicts = st.dictionaries(st.text(max_size=8), scalars, max_size=5)


@FUZZ
@given(
    path=st.text(max_size=20),
    meta=flat_dicts,
    cb_kwargs=flat_dicts,
    headers=st.dictionaries(
        st.sampled_from(["Referer", "Accept", "X-A", "Cookie", "Authorization"]),
        st.lists(st.binary(max_size=6), min_size=1, max_size=3),
        max_size=3,
    ),
    priority=st.integers(-(2**40), 2**40),
    dont_filter=st.booleans(),
    method=st.sampled_from(["GET", "POST", "HEAD"]),
    body=st.binary(max_size=8),
)
def test_random_flat_requests_are_written_as_their_documents_are(
    path, meta, cb_kwargs, headers, priority, dont_filter, method, body
):
    def make() -> scrapy.Request:
        return scrapy.Request(
            "http://h.example/" + path,
            callback=SPIDER.parse_item,
            meta=meta,
            cb_kwargs=cb_kwargs,
            headers=headers,
            priority=priority,
            dont_filter=dont_filter,
            method=method,
            body=body,
        )

    flat, document = both(make)
    surrogate = any(
        isinstance(x, str) and any("\ud800" <= c <= "\udfff" for c in x)
        for x in (path, *meta, *meta.values(), *cb_kwargs, *cb_kwargs.values())
    )
    keys = [*meta, *cb_kwargs]
    if surrogate or any(k.startswith("__") for k in keys):
        assert flat is None or flat == document
    else:
        assert flat == document


def depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


def test_a_flat_payload_is_nested_no_deeper_than_flat_depth():
    assert FLAT_DEPTH < MAX_DEPTH
    flat = flat_payload(FLAT["referer"](URLS[0]), SPIDER)
    assert flat is not None and depth(json.loads(flat)) == FLAT_DEPTH


def test_brackets_in_a_flat_requests_strings_are_no_nesting():
    make = lambda: scrapy.Request(URLS[0], meta={"s": "[{" * 200})  # noqa: E731
    assert encode_request(make(), SPIDER) == by_document(make())


def test_a_flat_request_too_large_to_store_is_refused_as_before():
    request = scrapy.Request(URLS[0], method="POST", body=b"x" * MAX_PAYLOAD_BYTES)
    assert flat_payload(request, SPIDER) is not None
    with pytest.raises(CodecError, match="MAX_PAYLOAD_BYTES"):
        encode_request(request, SPIDER)


def test_header_names_and_values_met_again_are_written_as_the_first_time(monkeypatch):
    monkeypatch.setattr(flat, "_TAGGED", {})
    monkeypatch.setattr(flat, "TAGGED_REMEMBERED", 3)
    values = [b"Referer", b"http://a.test/list", b"x" * (flat.TAGGED_MAX_BYTES + 1)]
    assert [flat._tagged(v) for v in values] == [flat._bytes(v) for v in values]
    assert [flat._tagged(v) for v in values] == [flat._bytes(v) for v in values]  # again
    assert set(flat._TAGGED) == set(values[:2])  # the long one is not remembered
    for n in range(3):
        flat._tagged(b"v%d" % n)
    assert len(flat._TAGGED) <= 3  # full: forgotten, and filled again


def test_scrapys_headers_are_read_as_their_items_give_them():
    from scrapy_ha.codec.credentials import clean_headers

    request = scrapy.Request(
        "http://a.test/",
        headers={"x-custom": ["a", "b"], "REFERER": "http://a.test/l", "Proxy-Authorization": "x"},
    )
    expected = {k: v for k, v in request.headers.items() if k != b"Proxy-Authorization"}
    assert clean_headers(request, None) == expected
    assert list(expected) == [b"X-Custom", b"Referer"]
    # names items() looks up otherwise than stored: it gives them no values, nor does this
    odd = scrapy.Request("http://a.test/", headers={"X-Straße": "v", "Referer": "r"})
    odd.headers |= {"x-a": "val"}
    assert clean_headers(odd, None) == dict(odd.headers.items())
    # (Scrapy 2.16 names it X-Stra\xc3\x9fE, with its value; 2.19 X-Stra\xc3\x9fe, with none)
    assert any(name.startswith(b"X-Stra\xc3\x9f") for name in clean_headers(odd, None))


def test_only_header_names_and_referers_are_remembered(monkeypatch):
    monkeypatch.setattr(flat, "_TAGGED", {})
    request = scrapy.Request(
        "http://a.test/", headers={"Referer": "http://a.test/l", "X-Api-Key": "secret"}
    )
    assert flat_payload(request, None) is not None
    assert set(flat._TAGGED) == {b"Referer", b"http://a.test/l", b"X-Api-Key"}
