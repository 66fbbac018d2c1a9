"""Which classes and methods a payload may make a worker build or call.

A payload is data written by whoever can write to Redis: it may name only classes this
worker trusts (stored by itself, defined in the spider's package, or listed in
HA_CODEC_CLASSES) and only public methods of the spider, found without running code.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import types

import pytest
import scrapy
from scrapy.http.request.form import FormRequest  # (2.16: scrapy.http's is a subclass)
from scrapy.spiders import CrawlSpider, SitemapSpider
from scrapy.utils.test import get_crawler

from scrapy_ha.codec import CodecError, decode_request, encode_request, trust


@dataclasses.dataclass
class LocalItem:
    """Defined in the spider's own package (``tests``): payloads may build it."""

    name: str = ""


class ClassesSpider(scrapy.Spider):
    name = "classes"
    property_runs = 0

    def parse(self, response):
        pass

    @property
    def page(self):
        type(self).property_runs += 1
        return self.parse


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    """As in a worker that has stored nothing yet (a restarted one)."""
    monkeypatch.setattr(trust, "NAMES", {})


def spider(settings=None):
    crawler = get_crawler(ClassesSpider, settings or {})
    return ClassesSpider.from_crawler(crawler)


def payload(**fields):
    return json.dumps({"v": 1, "u": "http://x/", **fields})


FOREIGN_ITEMS = [
    # an attrs class of Twisted, a dataclass of redis with a __post_init__ hook
    ("twisted.internet.address:IPv4Address", {"type": "TCP", "host": "h", "port": 1}),
    ("redis.driver_info:DriverInfo", {}),
]


@pytest.mark.parametrize(("name", "fields"), FOREIGN_ITEMS)
def test_a_library_item_class_is_refused(name, fields):
    __import__(name.partition(":")[0])
    doc = payload(mt={"a": {"__i": [name, fields]}})
    with pytest.raises(CodecError, match="HA_CODEC_CLASSES"):
        decode_request(doc, spider())


def test_a_listed_library_class_is_built():
    doc = payload(mt={"a": {"__i": [FOREIGN_ITEMS[0][0], FOREIGN_ITEMS[0][1]]}})
    worker = spider({"HA_CODEC_CLASSES": ["twisted.internet.address:IPv4Address"]})
    assert decode_request(doc, worker).meta["a"].host == "h"


def test_a_class_this_worker_stored_is_built():
    from twisted.internet.address import IPv4Address

    worker = spider()
    request = scrapy.Request("http://x/", meta={"a": IPv4Address("TCP", "h", 1)})
    assert decode_request(encode_request(request, worker), worker).meta["a"].port == 1


def test_a_class_of_the_spiders_package_is_built():
    doc = payload(mt={"a": {"__i": [f"{__name__}:LocalItem", {"name": "n"}]}})
    assert decode_request(doc, spider()).meta["a"] == LocalItem("n")


@pytest.mark.parametrize("member", [["re:RegexFlag", None, 3], ["socket:AddressFamily", "AF_INET"]])
def test_a_stdlib_enum_is_refused(member):
    # RegexFlag(3) runs Flag._missing_ to build a combination: code a payload must not pick
    doc = payload(mt={"a": {"__e": member}})
    with pytest.raises(CodecError, match="HA_CODEC_CLASSES"):
        decode_request(doc, spider())


def test_a_stored_stdlib_enum_is_built():
    worker = spider()
    request = scrapy.Request("http://x/", meta={"a": re.IGNORECASE | re.MULTILINE})
    assert decode_request(encode_request(request, worker), worker).meta["a"] == re.I | re.M


def test_scrapys_spider_machinery_is_no_callback():
    for name in ("_set_crawler", "start", "update_settings", "log", "__init__", "__class__"):
        with pytest.raises(CodecError, match=f"no callback method '{name}'"):
            decode_request(payload(cb=name), spider())
        with pytest.raises(CodecError, match=f"no callback method '{name}'"):
            decode_request(payload(eb=name), spider())


def test_a_property_is_no_callback_and_does_not_run():
    ClassesSpider.property_runs = 0
    with pytest.raises(CodecError, match="no callback method 'page'"):
        decode_request(payload(cb="page"), spider())
    assert ClassesSpider.property_runs == 0


def test_a_public_method_is_a_callback():
    worker = spider()
    assert decode_request(payload(cb="parse"), worker).callback == worker.parse


def test_scrapys_request_classes_are_built():
    doc = payload(cls="scrapy.http.request.form:FormRequest")
    assert type(decode_request(doc, spider())) is FormRequest


def test_a_foreign_request_subclass_is_refused(monkeypatch):
    module = types.ModuleType("ha_foreign_plugin")
    cls = type("PluginRequest", (scrapy.Request,), {"__module__": module.__name__})
    module.PluginRequest = cls
    monkeypatch.setitem(sys.modules, module.__name__, module)
    doc = payload(cls="ha_foreign_plugin:PluginRequest")
    with pytest.raises(CodecError, match="HA_CODEC_CLASSES"):
        decode_request(doc, spider())
    worker = spider({"HA_CODEC_CLASSES": ["ha_foreign_plugin.PluginRequest"]})
    assert type(decode_request(doc, worker)) is cls


class RulesSpider(CrawlSpider):
    name = "rules"


class MapSpider(SitemapSpider):
    name = "map"

    def _parse_sitemap(self, response):  # an override, as projects do
        return super()._parse_sitemap(response)


def test_scrapys_own_private_callbacks_round_trip_on_their_spiders():
    rules, sitemap = RulesSpider(), MapSpider()
    request = scrapy.Request("http://x/", callback=rules._callback, errback=rules._errback)
    copy = decode_request(encode_request(request, rules), rules)
    assert copy.callback == rules._callback and copy.errback == rules._errback
    request = scrapy.Request("http://x/", callback=sitemap._parse_sitemap)
    copy = decode_request(encode_request(request, sitemap), sitemap)
    assert copy.callback == sitemap._parse_sitemap
    # on another spider those names are no methods at all
    with pytest.raises(CodecError, match="no callback method '_callback'"):
        decode_request(payload(cb="_callback"), sitemap)


def test_a_scrapy_item_of_a_shared_library_is_built_by_a_fresh_worker(monkeypatch):
    # items often live in a package of their own, shared by several projects: a worker that
    # never stored one must still read it (Scrapy's Item.__init__ only fills fields)
    module = types.ModuleType("ha_shared_items")
    item_cls = type(
        "SharedItem", (scrapy.Item,), {"__module__": module.__name__, "name": scrapy.Field()}
    )
    module.SharedItem = item_cls
    monkeypatch.setitem(sys.modules, module.__name__, module)
    doc = json.dumps(
        {
            "v": 1,
            "u": "http://x/",
            "mt": {"i": {"__i": ["ha_shared_items:SharedItem", {"name": "a"}]}},
        }
    )
    item = decode_request(doc, spider()).meta["i"]
    assert type(item) is item_cls and item["name"] == "a"


RUNS: list[str] = []


def _hooks() -> dict[str, dict]:
    """What a library's base class may define that building an item runs."""

    def init(self, *args, **kwargs):
        RUNS.append("__init__")
        scrapy.Item.__init__(self, *args, **kwargs)

    def setitem(self, key, value):
        RUNS.append("__setitem__")
        scrapy.Item.__setitem__(self, key, value)

    def values_get(self):
        return self.__dict__["_v"]

    def values_set(self, value):
        RUNS.append("_values setter")
        self.__dict__["_v"] = value

    class CallingMeta(type(scrapy.Item)):
        def __call__(cls, *args, **kwargs):
            RUNS.append("metaclass __call__")
            return super().__call__(*args, **kwargs)

    return {
        "__init__": {"__init__": init},
        "__setitem__": {"__setitem__": setitem},
        "property": {"_values": property(values_get, values_set)},
        "metaclass": {"metaclass": CallingMeta},
        "mixin": {"mixin": type("Mixin", (), {"__init__": init})},
    }


def library_item(monkeypatch, hook: str) -> type:
    """``ha_item_lib:Leaf``: a Field-only item class of a library (not the spider's
    package), whose base class *hook* names what it defines."""
    module = types.ModuleType("ha_item_lib")
    body = dict(_hooks()[hook])
    meta = body.pop("metaclass", type(scrapy.Item))
    mixin = body.pop("mixin", None)
    bases = (mixin, scrapy.Item) if mixin else (scrapy.Item,)
    base = meta("Base", bases, {"__module__": module.__name__, **body})
    leaf = meta("Leaf", (base,), {"__module__": module.__name__, "name": scrapy.Field()})
    module.Base, module.Leaf = base, leaf
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return leaf


@pytest.mark.parametrize("hook", ["__init__", "__setitem__", "property", "metaclass", "mixin"])
def test_an_item_class_that_inherits_code_from_a_library_base_is_refused(monkeypatch, hook):
    # Leaf's own body holds a Field only: what runs is inherited, and it must not run on a
    # payload's say-so (issue 36 item 13)
    leaf = library_item(monkeypatch, hook)
    doc = payload(mt={"i": {"__i": ["ha_item_lib:Leaf", {"name": "a"}]}})
    RUNS.clear()
    with pytest.raises(CodecError, match="ha_item_lib:Leaf.*HA_CODEC_CLASSES"):
        decode_request(doc, spider())
    assert RUNS == []
    listed = spider({"HA_CODEC_CLASSES": ["ha_item_lib:Leaf"]})
    item = decode_request(doc, listed).meta["i"]
    assert type(item) is leaf and item["name"] == "a" and RUNS


def test_a_library_item_with_methods_of_its_own_is_still_built(monkeypatch):
    module = types.ModuleType("ha_item_lib")
    base = type(
        "Base",
        (scrapy.Item,),
        {"__module__": module.__name__, "describe": lambda self: "item", "KIND": "product"},
    )
    module.Leaf = type("Leaf", (base,), {"__module__": module.__name__, "name": scrapy.Field()})
    monkeypatch.setitem(sys.modules, module.__name__, module)
    doc = payload(mt={"i": {"__i": ["ha_item_lib:Leaf", {"name": "a"}]}})
    assert decode_request(doc, spider()).meta["i"].describe() == "item"
