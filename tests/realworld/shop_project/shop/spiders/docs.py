"""A CrawlSpider following the documentation with a Rule."""

from __future__ import annotations

from typing import Any

from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule


class DocsSpider(CrawlSpider):
    name = "docs_crawl"
    base = ""
    rules = (Rule(LinkExtractor(allow=r"/docs/\d+$"), callback="parse_doc", follow=True),)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start_urls = [f"{self.base}/docs/"]

    def parse_doc(self, response: Any) -> Any:
        yield {"key": response.css("h1.title::text").get()}
