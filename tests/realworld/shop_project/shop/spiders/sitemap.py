"""A SitemapSpider routing products and docs to their callbacks."""

from __future__ import annotations

from typing import Any

from scrapy.spiders import SitemapSpider


class ShopSitemapSpider(SitemapSpider):
    name = "sitemap"
    base = ""
    sitemap_rules = [("/product/", "parse_product"), ("/docs/", "parse_doc")]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sitemap_urls = [f"{self.base}/sitemap.xml"]

    def parse_product(self, response: Any) -> Any:
        yield {"key": response.css("h1.name::text").get()}

    def parse_doc(self, response: Any) -> Any:
        yield {"key": response.css("h1.title::text").get()}
