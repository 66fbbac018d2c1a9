"""The request codec: exact round trips of every supported type, no credentials stored,
refusal of anything but known-safe classes, clear errors."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
import logging
import sys
import uuid
from decimal import Decimal
from pathlib import Path
from zoneinfo import ZoneInfo

import attr
import pytest
import scrapy
from scrapy.http import FormRequest, JsonRequest
from w3lib.http import basic_auth_header

from scrapy_ha.codec import CodecError, decode_request, encode_request, mask_url


class Spider(scrapy.Spider):
    name = "codec"

    def parse_item(self, response):  # pragma: no cover - only referenced
        pass

    def on_error(self, failure):  # pragma: no cover
        pass

    def _private_parse(self, response):  # pragma: no cover
        pass


SPIDER = Spider()


class Product(scrapy.Item):
    name = scrapy.Field()
    price = scrapy.Field()
    tags = scrapy.Field()


@dataclasses.dataclass
class Offer:
    sku: str
    price: Decimal
    seen: datetime.datetime | None = None
    slug: str = dataclasses.field(init=False, default="")


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: int


@attr.define
class AttrsItem:
    name: str
    _secret_code: int = 0


try:  # pydantic is optional for scrapy-ha and for its tests (in the test extra)
    import pydantic
except ImportError:  # pragma: no cover
    pydantic = None
else:

    class PydanticItem(pydantic.BaseModel):
        name: str
        when: datetime.date
        price: Decimal = Decimal("0")


class Color(enum.Enum):
    RED = "red"
    BLUE = 2


class Level(enum.IntEnum):
    LOW = 1


class Perm(enum.Flag):
    R = 1
    W = 2


class Outer:
    class Inner(enum.Enum):
        A = 1


class TrackedRequest(scrapy.Request):
    """A user's subclass with an attribute of its own."""

    attributes = (*scrapy.Request.attributes, "campaign")

    def __init__(self, *args, campaign: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.campaign = campaign


def roundtrip(request: scrapy.Request) -> scrapy.Request:
    return decode_request(encode_request(request, SPIDER), SPIDER)


def same(a, b) -> bool:
    """Equal, and of the same types all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(
            same(a[k], b[k]) and type(k) is type(kb) for k, kb in zip(a, b, strict=True)
        )
    if isinstance(a, scrapy.Item):
        return same(dict(a), dict(b))
    if isinstance(a, scrapy.Request):
        return a.to_dict(spider=SPIDER) == b.to_dict(spider=SPIDER)
    if isinstance(a, datetime.time):
        return a == b and a.fold == b.fold and a.tzinfo == b.tzinfo
    if isinstance(a, datetime.datetime):
        return (
            a == b and a.tzinfo == b.tzinfo and a.fold == b.fold and a.utcoffset() == b.utcoffset()
        )
    return a == b


PARIS = ZoneInfo("Europe/Paris")
TOKYO = ZoneInfo("Asia/Tokyo")
HOURS_3 = datetime.timedelta(hours=3)
VALUES = {
    "bytes": b"\x00\xff",
    "tuple": (1, "x", (b"y",)),
    "set": {1, "a", (2, 3)},
    "frozenset": frozenset({b"a", 1}),
    "dict with int keys": {1: "one", (2, 3): "tuple key", None: 0},
    "dict with dunder keys": {"__b": "not a tag", "__weird": 1},
    "naive datetime": datetime.datetime(2026, 3, 29, 2, 30, 1, 5),
    "utc datetime": datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
    "offset datetime": datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone(-HOURS_3)),
    "zoneinfo datetime": datetime.datetime(2026, 10, 25, 2, 30, tzinfo=PARIS),
    "zoneinfo datetime, second 2:30": datetime.datetime(2026, 10, 25, 2, 30, fold=1, tzinfo=PARIS),
    "zoneinfo datetime in the DST gap": datetime.datetime(2026, 3, 29, 2, 30, tzinfo=PARIS),
    "zoneinfo datetime at the end of time": datetime.datetime.max.replace(tzinfo=TOKYO),
    "naive datetime, fold=1": datetime.datetime(2026, 10, 25, 2, 30, fold=1),
    "time, fold=1": datetime.time(2, 30, fold=1),
    "date": datetime.date(2026, 11, 30),
    "time": datetime.time(12, 15, 0, 7),
    "timedelta": datetime.timedelta(days=-1, seconds=5, microseconds=3),
    "Decimal": Decimal("19.990"),
    "Decimal NaN-free huge": Decimal("1E+400"),
    "UUID": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "Enum": Color.RED,
    "IntEnum": Level.LOW,
    "Flag combination": Perm.R | Perm.W,
    "nested class Enum": Outer.Inner.A,
    "scrapy.Item": Product(name="lamp", price=Decimal("9.5"), tags={"a", "b"}),
    "empty scrapy.Item": Product(),
    "dataclass": Offer("s1", Decimal("1.10"), datetime.datetime(2026, 1, 2)),
    "frozen dataclass": Frozen(3),
    "attrs": AttrsItem("n", 7),
    "floats": [1.5, -0.0, 1e300],
    "big int": 2**100,
    "nested": {"a": [{"b": ({1: Color.BLUE},)}]},
    "str subclass kept as str": "plain",
}
if pydantic is not None:
    VALUES["pydantic"] = PydanticItem(
        name="p", when=datetime.date(2026, 1, 1), price=Decimal("2.5")
    )


@pytest.mark.parametrize("value", list(VALUES.values()), ids=list(VALUES))
def test_every_supported_type_round_trips_with_its_type(value):
    request = scrapy.Request("https://example.com/t", meta={"v": value}, cb_kwargs={"v": value})
    copy = roundtrip(request)
    for got in (copy.meta["v"], copy.cb_kwargs["v"]):
        assert same(got, value), (got, value)


def test_dataclass_fields_outside_init_round_trip():
    offer = Offer("s", Decimal(1))
    offer.slug = "set later"
    copy = roundtrip(scrapy.Request("https://e.com", meta={"o": offer}))
    assert copy.meta["o"].slug == "set later"


def test_a_nested_request_round_trips_with_its_callback():
    inner = scrapy.Request(
        "https://example.com/next",
        callback=SPIDER.parse_item,
        errback=SPIDER.on_error,
        meta={"item": Product(name="x")},
        priority=3,
    )
    copy = roundtrip(
        scrapy.Request("https://example.com", meta={"next": inner}, cb_kwargs={"later": [inner]})
    )
    for got in (copy.meta["next"], copy.cb_kwargs["later"][0]):
        assert same(got, inner)
        assert got.callback == SPIDER.parse_item and got.errback == SPIDER.on_error


def test_every_field_round_trips_exactly():
    request = scrapy.Request(
        "https://example.com/a?b=1",
        callback=SPIDER.parse_item,
        errback=SPIDER.on_error,
        method="POST",
        body=b"\x00\xffbinary",
        headers={"X-Bin": b"\xfe", "Accept": ["a", "b"]},
        cookies={"c": "1"},
        meta={
            "bytes": b"\x01",
            "tuple": (1, "x"),
            "nested": {"k": [b"v"]},
            "int_keys": {1: "one"},
            "depth": 3,
            "__weird": 1,
        },
        encoding="latin-1",
        priority=7,
        dont_filter=True,
        flags=["f"],
        cb_kwargs={"page": 2},
    )
    copy = roundtrip(request)
    assert copy.to_dict(spider=SPIDER) == request.to_dict(spider=SPIDER)
    assert copy.callback == SPIDER.parse_item and copy.errback == SPIDER.on_error


def test_a_private_method_of_the_spider_is_a_callback_too():
    # Scrapy users write `callback=self._parse_detail`; only Scrapy's machinery is refused
    request = scrapy.Request("https://example.com", callback=SPIDER._private_parse)
    assert roundtrip(request).callback == SPIDER._private_parse


def test_scrapys_machinery_is_refused_at_encoding_with_the_fix():
    # refusing it when storing tells the user at once, rather than dead-lettering every
    # such request on the next worker
    request = scrapy.Request("https://example.com", callback=SPIDER._set_crawler)
    with pytest.raises(CodecError, match="'_set_crawler' is part of Scrapy's spider machinery"):
        encode_request(request, SPIDER)


def test_a_plain_request_is_small():
    payload = encode_request(scrapy.Request("http://127.0.0.1:8000/item/12345"), SPIDER)
    assert payload == b'{"v":1,"u":"http://127.0.0.1:8000/item/12345"}'
    request = scrapy.Request("http://127.0.0.1:8000/item/1", callback=SPIDER.parse_item)
    assert (
        encode_request(request, SPIDER)
        == b'{"v":1,"u":"http://127.0.0.1:8000/item/1","cb":"parse_item"}'
    )


# Scrapy 2.16 deprecates FormRequest itself (2.19 only its from_response): still stored
@pytest.mark.filterwarnings("ignore:scrapy.http.FormRequest is deprecated")
@pytest.mark.parametrize("cls", [FormRequest, JsonRequest])
def test_request_subclasses_round_trip(cls):
    request = cls("https://example.com/form", method="POST", body=b"a=1")
    copy = roundtrip(request)
    assert type(copy) is cls
    assert copy.body == request.body


def test_json_request_keeps_its_dumps_kwargs():
    request = JsonRequest(
        "https://example.com/api",
        data={"b": 1, "a": 2},
        dumps_kwargs={"sort_keys": True, "indent": 1},
    )
    copy = roundtrip(request)
    assert type(copy) is JsonRequest and copy.dumps_kwargs == {"sort_keys": True, "indent": 1}
    assert copy.body == request.body
    assert copy.replace(data={"z": 1, "y": 2}).body == b'{\n "y": 2,\n "z": 1\n}'


def test_a_users_request_subclass_keeps_its_own_attributes():
    request = TrackedRequest("https://example.com/p", campaign="spring", callback=SPIDER.parse_item)
    copy = roundtrip(request)
    assert type(copy) is TrackedRequest and copy.campaign == "spring"
    assert copy.callback == SPIDER.parse_item


# ---------------------------------------------------------------------------- meta keys


def test_meta_keys_scrapy_components_read_survive():
    meta = {
        "download_timeout": 5,
        "max_retry_times": 2,
        "retry_times": 1,
        "dont_redirect": True,
        "dont_retry": False,
        "handle_httpstatus_list": [404],
        "handle_httpstatus_all": True,
        "cookiejar": 3,
        "dont_merge_cookies": True,
        "proxy": "http://proxy:8080",
        "depth": 4,
        "redirect_urls": ["https://a.example/"],
        "redirect_times": 1,
        "redirect_ttl": 19,
        "redirect_reasons": [301],
        "download_maxsize": 10,
        "dont_cache": True,
        "referrer_policy": "no-referrer",
        "bindaddress": ("127.0.0.1", 0),
        "ha_task": "t",
        "download_slot": "slow-lane",
    }
    assert same(roundtrip(scrapy.Request("https://example.com/m", meta=meta)).meta, meta)


def test_a_download_slot_the_spider_chose_is_kept_and_the_downloaders_own_is_not():
    chosen = scrapy.Request("https://example.com/a", meta={"download_slot": "api"})
    assert roundtrip(chosen).meta == {"download_slot": "api"}
    # what the downloader writes on every download: the host (recomputed by the next worker)
    written = scrapy.Request("https://example.com:8443/a", meta={"download_slot": "example.com"})
    assert roundtrip(written).meta == {}


@pytest.mark.parametrize("general", [False, True], ids=["flat", "document"])
def test_the_timeout_downloadtimeoutmiddleware_sets_is_not_stored_one_the_spider_set_is(general):
    """DownloadTimeoutMiddleware writes its timeout into the meta of every request it
    downloads: stored with a retry or a revisit, that held the request to the first
    worker's timeout for ever (a new DOWNLOAD_TIMEOUT never reached it)."""
    from scrapy.utils.test import get_crawler

    spider = Spider.from_crawler(get_crawler(Spider, {"DOWNLOAD_TIMEOUT": 30}))
    odd = {"tags": {"a"}} if general else {}  # a set: not flat, written as a document

    def stored(meta: dict, on=spider) -> dict:
        request = scrapy.Request("https://example.com/a", meta={**meta, **odd})
        doc = json.loads(encode_request(request, on))
        return {k: v for k, v in doc.get("mt", {}).items() if k != "tags"}

    assert stored({"download_timeout": 30.0, "depth": 2}) == {"depth": 2}
    assert stored({"download_timeout": 30}) == {}
    assert stored({"download_timeout": 7.5}) == {"download_timeout": 7.5}  # the spider's
    spider.download_timeout = 12  # DownloadTimeoutMiddleware's default then
    assert stored({"download_timeout": 12.0}) == {}
    assert stored({"download_timeout": 30.0}) == {"download_timeout": 30.0}
    # without a crawler's settings (the CLI's push): kept as it is
    assert stored({"download_timeout": 30.0}, SPIDER) == {"download_timeout": 30.0}
    # where the middleware sets none, a request's own timeout is all its download has
    spider.download_timeout = None
    assert stored({"download_timeout": 30.0}) == {"download_timeout": 30.0}
    middleware = "scrapy.downloadermiddlewares.downloadtimeout.DownloadTimeoutMiddleware"
    off = {"DOWNLOADER_MIDDLEWARES": {middleware: None}}
    for settings in ({"DOWNLOAD_TIMEOUT": 0}, off, {**off, "DOWNLOAD_TIMEOUT": "abc"}):
        other = Spider.from_crawler(get_crawler(Spider, settings))
        assert stored({"download_timeout": 0}, other) == {"download_timeout": 0}
        assert stored({"download_timeout": 180.0}, other) == {"download_timeout": 180.0}


def test_per_attempt_meta_keys_are_not_stored():
    meta = {
        "ha_lease": ("1", "2"),
        "_ha_parent": ("1", "2"),
        "ha_outcome": {"op": "retry"},
        "download_latency": 0.5,
        "cached_response": object(),
        "_auth_proxy": "http://p:1",
        "depth": 1,
    }
    assert roundtrip(scrapy.Request("https://example.com", meta=meta)).meta == {"depth": 1}


def test_a_proxy_taken_from_the_workers_environment_is_not_stored():
    meta = {"proxy": "http://envproxy:3128", "_scheme_proxy": True}
    request = scrapy.Request("https://example.com", meta=meta)
    assert roundtrip(request).meta == {}


# ---------------------------------------------------------------------------- credentials


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


class AuthSpider(scrapy.Spider):
    name = "auth"
    http_user = "scott"
    http_pass = "tiger-secret"  # noqa: S105


def test_the_authorization_header_httpauth_adds_is_not_stored():
    spider = AuthSpider()
    header = basic_auth_header("scott", "tiger-secret")
    request = scrapy.Request("https://example.com", headers={"Authorization": header})
    payload = encode_request(request, spider)
    assert header not in payload and b"Authorization" not in payload
    per_request = scrapy.Request(
        "https://example.com",
        headers={"Authorization": basic_auth_header("u", "meta-secret")},
        meta={"http_user": "u", "http_pass": "meta-secret"},
    )
    assert b"Authorization" not in encode_request(per_request, SPIDER)


def test_an_authorization_header_the_spider_set_itself_is_kept():
    request = scrapy.Request("https://example.com/api", headers={"Authorization": "Bearer abc"})
    assert roundtrip(request).headers["Authorization"] == b"Bearer abc"
    assert (
        decode_request(encode_request(request, AuthSpider()), SPIDER).headers["Authorization"]
        == b"Bearer abc"
    )


def test_the_cookie_header_is_left_to_the_cookie_jar():
    request = scrapy.Request("https://example.com", headers={"Cookie": "session=s3cret"})
    assert b"s3cret" not in encode_request(request, SPIDER)
    # with dont_merge_cookies CookiesMiddleware leaves the header alone: it is the spider's own
    own = scrapy.Request(
        "https://example.com", headers={"Cookie": "a=1"}, meta={"dont_merge_cookies": True}
    )
    assert roundtrip(own).headers["Cookie"] == b"a=1"


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://:s3cret@host:6379/0", "redis://:***@host:6379/0"),
        ("redis://user:s3cret@host/1", "redis://user:***@host/1"),
        ("redis://host:6379", "redis://host:6379"),
        (
            "https://pool.example/list?key=abc123&country=fr",
            "https://pool.example/list?key=***&country=fr",
        ),
        (
            "https://p.example/?api_key=a&apikey=b&token=c&access_token=d&password=e&secret=f&sig=g",
            "https://p.example/?api_key=***&apikey=***&token=***&access_token=***&password=***&secret=***&sig=***",
        ),
        (
            "https://p.example/?X-Api-Key=a&monkey=banana&page=2#frag",
            "https://p.example/?X-Api-Key=***&monkey=banana&page=2#frag",
        ),
        ("http://u:p@pool.example/?Token=t", "http://u:***@pool.example/?Token=***"),
    ],
)
def test_mask_url(url, masked):
    assert mask_url(url) == masked


# ---------------------------------------------------------------------------- errors


def test_a_callback_that_is_not_a_spider_method_fails_naming_url_and_field():
    with pytest.raises(CodecError, match=r"https://example.com/x.*callback.*not a method"):
        encode_request(scrapy.Request("https://example.com/x", callback=lambda r: None), SPIDER)


def test_unencodable_meta_fails_naming_url_path_type_and_fix():
    request = scrapy.Request("https://example.com/y", meta={"a": {"b": [1, object()]}})
    expected = r"https://example.com/y: meta\['a'\]\['b'\]\[1\] is of type builtins.object"
    with pytest.raises(CodecError, match=expected + ".*HA_UNSTORABLE") as info:
        encode_request(request, SPIDER)
    assert "Store one of" in str(info.value)


def test_a_class_defined_in_a_function_is_refused_at_encoding():
    @dataclasses.dataclass
    class Local:
        a: int

    with pytest.raises(CodecError, match=r"cb_kwargs\['x'\].*Local.*module's top level"):
        encode_request(scrapy.Request("https://example.com/z", cb_kwargs={"x": Local(1)}), SPIDER)


def test_drop_key_leaves_out_only_the_offending_key_with_one_warning(caplog):
    def request():
        return scrapy.Request(
            "https://example.com/d",
            meta={"fh": open(__file__), "ok": 1},  # noqa: SIM115
            cb_kwargs={"page": 2, "fh": Path},
        )

    first, second = request(), request()
    with caplog.at_level(logging.WARNING, logger="scrapy_ha.codec"):
        copies = [
            decode_request(encode_request(r, SPIDER, unstorable="drop-key"), SPIDER)
            for r in (first, second)
        ]
    for r in (first, second):
        r.meta["fh"].close()
    assert all(c.meta == {"ok": 1} and c.cb_kwargs == {"page": 2} for c in copies)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings  # one per key, not one per request
    assert any(
        "meta['fh']" in w and "TextIOWrapper" in w and "example.com/d" in w for w in warnings
    )


# ---------------------------------------------------------------------------- refusals


def payload(**doc) -> bytes:
    return json.dumps({"v": 1, "u": "http://x", **doc}).encode()


def test_a_payload_naming_a_function_is_refused_and_runs_nothing(tmp_path):
    target = tmp_path / "owned.pth"
    evil = payload(cls="urllib.request.urlretrieve", x={"filename": str(target)})
    evil_new = payload(cls="urllib.request:urlretrieve", x={"filename": str(target)})
    for p in (evil, evil_new):
        with pytest.raises(CodecError, match="not a Request class"):
            decode_request(p, SPIDER)
    assert not target.exists()


def test_a_payload_naming_a_module_not_yet_imported_imports_nothing():
    name = "antigravity"  # imports a module with a side effect (opens a web browser)
    assert name not in sys.modules
    for p in (
        payload(cls=f"{name}:Request"),
        payload(mt={"i": {"__i": [f"{name}:X", {}]}}),
        payload(mt={"e": {"__e": [f"{name}:E", "A"]}}),
    ):
        with pytest.raises(CodecError, match="not imported"):
            decode_request(p, SPIDER)
    assert name not in sys.modules


@pytest.mark.parametrize(
    "doc",
    [
        {"cls": "builtins:dict"},
        {"cls": "scrapy.http:Response"},
        {"cls": "tests.test_codec:Product"},
        {"cls": "subprocess:Popen"},
        {"cls": "os:system"},
        {"cls": "tests.test_codec:TrackedRequest.__init__.__globals__"},
        {"cls": "tests.test_codec:TrackedRequest", "x": {"callback_url": "x"}},
        {"cls": "scrapy.http:JsonRequest", "x": {"campaign": "x"}},
        {"x": {"dumps_kwargs": {}}},
        {"mt": {"i": {"__i": ["builtins:dict", {}]}}},
        {"mt": {"i": {"__i": ["subprocess:Popen", {"args": "id"}]}}},
        {"mt": {"i": {"__i": ["tests.test_codec:Color", {}]}}},
        {"mt": {"e": {"__e": ["tests.test_codec:Product", "name"]}}},
        {"mt": {"e": {"__e": ["subprocess:Popen", None, "id"]}}},
        {"mt": {"e": {"__e": ["tests.test_codec:Color", "GREEN"]}}},
        {"mt": {"i": {"__i": ["tests.test_codec:Product", {"undeclared": 1}]}}},
        {"mt": {"i": {"__i": ["tests.test_codec:Offer", {"sku": "a", "price": 1, "nope": 2}]}}},
        {"mt": {"r": {"__r": {"u": "http://y", "cls": "os:system"}}}},
        {"mt": {"z": {"__zz": 1}}},
    ],
)
def test_only_known_safe_classes_with_their_own_attributes_are_built(doc):
    with pytest.raises(CodecError):
        decode_request(payload(**doc), SPIDER)


@pytest.mark.parametrize(
    "raw",
    [
        b"\x80\x04pickle",
        b"{}",
        b'{"v": 99, "u": "http://x"}',
        b"[1]",
        b"null",
        b"1e999",
        b'{"v": 1, "u": 5}',
        b"[" * 100_000,
        b'{"v":1,"u":"http://x","mt":' + b"[" * 5000 + b"]" * 5000 + b"}",
        payload(cb="no_such_method"),
        payload(cb=["parse_item"]),
        payload(eb=None),
        payload(cb="__class__"),
        payload(cb="__init__"),
        payload(eb="name"),
        payload(cb="logger"),
        payload(b={"__b": "***not base64***"}),
        payload(b={"__b": 1}),
        payload(mt={"t": {"__t": 5}}),
        payload(mt={"d": {"__d": [[1]]}}),
        payload(mt={"d": {"__d": [[[1], 2]]}}),
        payload(mt={"s": {"__s": [[1]]}}),
        payload(x=[1]),
        payload(x={"__t": []}),
        payload(mt=[1]),
        payload(mt={"dt": {"__dt": "yesterday"}}),
        payload(mt={"dt": {"__dt": ["2026-01-01", "../../etc/passwd"]}}),
        payload(mt={"td": {"__td": [1, 2]}}),
        payload(mt={"td": {"__td": [10**12, 0, 0]}}),
        payload(mt={"dc": {"__dc": "abc"}}),
        payload(mt={"u": {"__u": "xyz"}}),
        payload(mt={"i": {"__i": "tests.test_codec:Product"}}),
        payload(mt={"r": {"__r": []}}),
        payload(mt={"r": {"__r": {"u": 1}}}),
        payload(h={"__d": [[{"__b": "QQ=="}, {"__i": 1}]]}),
        payload(p="high"),
        payload(m=["GET"]),
        payload(e="no-such-encoding", b={"__b": "QQ=="}),
        payload(cls=["scrapy.http:Request"]),
        payload(cls=""),
    ],
)
def test_a_corrupt_payload_is_a_codec_error(raw):
    with pytest.raises(CodecError):
        decode_request(raw, SPIDER)


def test_payloads_of_the_older_format_still_decode():
    old = b'{"v":1,"u":"https://example.com/form","m":"POST","cls":"scrapy.http.request.json_request.JsonRequest"}'
    assert type(decode_request(old, SPIDER)) is JsonRequest


def test_a_lone_surrogate_in_a_string_round_trips():
    request = scrapy.Request("https://example.com", meta={"s": "bad \ud800 text"})
    assert roundtrip(request).meta == {"s": "bad \ud800 text"}


def test_an_item_with_a_lone_surrogate_is_stored_and_read_back():
    from scrapy_ha.codec.items import decode_item, encode_item

    data = encode_item({"s": "bad \ud800 text", "ok": "é"}, SPIDER)
    assert b"\\ud800" in data  # a JSON escape: UTF-8 cannot hold it
    assert decode_item(data, SPIDER) == {"s": "bad \ud800 text", "ok": "é"}


def test_a_value_that_contains_itself_is_a_codec_error_or_a_dropped_key():
    loop: dict = {}
    loop["self"] = loop
    request = scrapy.Request("https://example.com/loop", meta={"loop": loop, "ok": 1})
    expected = r"example.com/loop: its meta\['loop'\] is nested too deeply"
    with pytest.raises(CodecError, match=expected):
        encode_request(request, SPIDER)
    assert roundtrip_drop(request).meta == {"ok": 1}


def roundtrip_drop(request: scrapy.Request) -> scrapy.Request:
    return decode_request(encode_request(request, SPIDER, unstorable="drop-key"), SPIDER)
