"""Listing -> detail, the partly filled item travelling with the request in four shapes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import scrapy

from shop.items import ProductAttrs, ProductData, ProductItem

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


class _ProductSpider(scrapy.Spider):
    base = ""

    async def start(self) -> AsyncIterator[Any]:
        yield scrapy.Request(f"{self.base}/products?page=1")

    def parse(self, response: Any) -> Any:
        for row in response.css("li.product"):
            href = row.css("a::attr(href)").get()
            yield self.detail(
                response.urljoin(href),
                href.rsplit("/", 1)[1],
                row.css("a::text").get(),
                row.css(".price::text").get(),
            )
        yield from response.follow_all(css="a.next", callback=self.parse)

    def detail(self, url: str, n: str, name: str, price: str) -> scrapy.Request:
        raise NotImplementedError


class ItemInMetaSpider(_ProductSpider):
    name = "item_meta"

    def detail(self, url: str, n: str, name: str, price: str) -> scrapy.Request:
        item = ProductItem(key=f"product:{n}", name=name, price=price)
        return scrapy.Request(url, callback=self.parse_detail, meta={"item": item})

    def parse_detail(self, response: Any) -> Any:
        item = response.meta["item"]
        assert isinstance(item, ProductItem), type(item)
        item["sku"] = response.css(".sku::text").get()
        yield item


class ItemInCbKwargsSpider(_ProductSpider):
    name = "item_cb_kwargs"

    def detail(self, url: str, n: str, name: str, price: str) -> scrapy.Request:
        item = ProductItem(key=f"product:{n}", name=name, price=price)
        return scrapy.Request(url, callback=self.parse_detail, cb_kwargs={"item": item})

    def parse_detail(self, response: Any, item: ProductItem) -> Any:
        assert isinstance(item, ProductItem), type(item)
        item["sku"] = response.css(".sku::text").get()
        yield item


class DataclassSpider(_ProductSpider):
    name = "item_dataclass"

    def detail(self, url: str, n: str, name: str, price: str) -> scrapy.Request:
        item = ProductData(key=f"product:{n}", name=name, price=price)
        return scrapy.Request(url, callback=self.parse_detail, meta={"item": item})

    def parse_detail(self, response: Any) -> Any:
        item = response.meta["item"]
        assert isinstance(item, ProductData), type(item)
        item.sku = response.css(".sku::text").get()
        yield item


class AttrsSpider(_ProductSpider):
    name = "item_attrs"

    def detail(self, url: str, n: str, name: str, price: str) -> scrapy.Request:
        item = ProductAttrs(key=f"product:{n}", name=name, price=price)
        return scrapy.Request(url, callback=self.parse_detail, meta={"item": item})

    def parse_detail(self, response: Any) -> Any:
        item = response.meta["item"]
        assert isinstance(item, ProductAttrs), type(item)
        item.sku = response.css(".sku::text").get()
        yield item
