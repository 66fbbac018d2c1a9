"""A stored callback's method looked up as ``inspect.getattr_static`` looks it up
(``trust._static_lookup``), for every class and its own names, metaclasses included."""

from __future__ import annotations

import gc
import inspect
from typing import Any

import pytest
import scrapy

from scrapy_ha.codec import CodecError, trust
from tests.test_codec import SPIDER


def outcome(lookup: Any, cls: type, name: str) -> tuple[str, Any]:
    try:
        return ("found", lookup(cls, name))
    except AttributeError:
        return ("missing", None)


class Meta(type):
    parse_item = property(lambda cls: "the metaclass's")  # a data descriptor of the metaclass

    def from_meta(cls) -> None:
        pass


class WithMeta(scrapy.Spider, metaclass=Meta):
    name = "with-meta"

    def parse_item(self, response: Any) -> None:
        pass


class ShadowingMeta(type):
    __dict__ = {"parse_item": "shadowed"}  # type: ignore[assignment]  # noqa: RUF012


class Shadowed(scrapy.Spider, metaclass=ShadowingMeta):
    name = "shadowed"

    def parse_item(self, response: Any) -> None:
        pass


NAMES = ["parse", "parse_item", "__init__", "__dict__", "__class__", "mro", "from_meta", "x"]


def test_every_class_and_name_is_looked_up_as_getattr_static_does():
    classes = [c for c in gc.get_objects() if isinstance(c, type)]
    classes += [type(SPIDER), WithMeta, Shadowed, Meta, type, object]
    compared = 0
    for cls in classes:
        for name in NAMES + sorted(type.__dict__["__dict__"].__get__(cls))[:20]:
            expected = outcome(inspect.getattr_static, cls, name)
            found = outcome(trust._static_lookup, cls, name)
            assert found[0] == expected[0] and found[1] is expected[1], (cls, name)
            compared += 1
    assert compared > 10_000


def test_a_spider_with_a_metaclass_of_its_own_gets_its_methods_as_before():
    spider = WithMeta()
    # getattr_static gives the class's own function, not the metaclass's property
    method = trust.callback_method(spider, "parse_item")
    assert method.__func__ is vars(WithMeta)["parse_item"] and method.__self__ is spider
    with pytest.raises(CodecError, match="no callback method 'from_meta'"):
        trust.callback_method(spider, "from_meta")
