"""Items in the four shapes itemadapter supports that Scrapy users write every day."""

from __future__ import annotations

import dataclasses

import attrs
import scrapy


class ProductItem(scrapy.Item):
    key = scrapy.Field()
    name = scrapy.Field()
    price = scrapy.Field()
    sku = scrapy.Field()


@dataclasses.dataclass
class ProductData:
    key: str
    name: str = ""
    price: str = ""
    sku: str = ""


@attrs.define
class ProductAttrs:
    key: str
    name: str = ""
    price: str = ""
    sku: str = ""
