"""A JSON API paginated by POST, an errback, and ``follow_all`` to related pages."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import scrapy
from scrapy.http import JsonRequest

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


class ApiSpider(scrapy.Spider):
    name = "api"
    base = ""

    async def start(self) -> AsyncIterator[Any]:
        yield self.page(1)

    def page(self, n: int) -> JsonRequest:
        return JsonRequest(
            f"{self.base}/api/products",
            data={"page": n},
            callback=self.parse,
            errback=self.failed,
            dont_filter=True,
            cb_kwargs={"page": n},
        )

    def parse(self, response: Any, page: int) -> Any:
        data = response.json()
        for row in data["items"]:
            yield {"key": f"api:{row['id']}", "name": row["name"], "page": page}
        yield from response.follow_all(
            data["related"], callback=self.parse_related, errback=self.failed
        )
        if data["next"]:
            yield self.page(data["next"])

    def parse_related(self, response: Any) -> Any:
        yield {"key": f"related:{response.css('h1.name::text').get()}"}

    def failed(self, failure: Any) -> None:
        self.logger.info("gone, skipped: %s", failure.request.url)
