"""Priorities, dont_filter, a Request subclass, and everyday Python values in meta."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import scrapy

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


class ProductRequest(scrapy.Request):
    """A project's own Request subclass."""


class MetaTypesSpider(scrapy.Spider):
    name = "meta_types"
    base = ""

    async def start(self) -> AsyncIterator[Any]:
        yield scrapy.Request(f"{self.base}/products?page=1")

    def parse(self, response: Any) -> Any:
        seen = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
        for i, href in enumerate(response.css("li.product a::attr(href)").getall()):
            meta = {
                "seen": seen,
                "day": date(2026, 1, 2),
                "price": Decimal(f"{i}.50"),
                "tags": {"new", f"t{i % 3}"},
            }
            yield ProductRequest(
                response.urljoin(href), callback=self.parse_detail, priority=i, meta=meta
            )
        # the first product again: dont_filter asks for a second visit
        yield ProductRequest(
            response.urljoin("/product/1"),
            callback=self.parse_detail,
            dont_filter=True,
            priority=-5,
            meta={
                "seen": seen,
                "day": date(2026, 1, 2),
                "price": Decimal("0.50"),
                "tags": {"again"},
            },
        )
        yield response.follow(
            "/product/11",
            callback=self.parse_detail,
            priority=100,
            meta={"seen": seen, "day": date(2026, 1, 2), "price": Decimal("11.50"), "tags": set()},
        )

    def parse_detail(self, response: Any) -> Any:
        m = response.meta
        assert isinstance(m["seen"], datetime) and isinstance(m["day"], date), m
        assert isinstance(m["price"], Decimal) and isinstance(m["tags"], set), m
        yield {
            "key": f"{response.css('h1.name::text').get()}:{sorted(m['tags'])}",
            "price": str(m["price"]),
            "day": m["day"].isoformat(),
            "subclass": type(response.request).__name__,
        }
