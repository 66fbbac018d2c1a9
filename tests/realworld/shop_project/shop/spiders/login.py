"""Log in with ``FormRequest.from_response``, then crawl pages that need the session cookie."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import scrapy

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


class LoginSpider(scrapy.Spider):
    name = "login"
    base = ""

    async def start(self) -> AsyncIterator[Any]:
        yield scrapy.Request(f"{self.base}/login", meta={"cookiejar": 1})

    def parse(self, response: Any) -> Any:
        yield scrapy.FormRequest.from_response(
            response,
            formdata={"user": "alice", "password": "secret"},
            meta={"cookiejar": response.meta["cookiejar"]},
            callback=self.after_login,
        )

    def after_login(self, response: Any) -> Any:
        yield response.follow(
            "/account/orders?page=1",
            callback=self.parse_orders,
            meta={"cookiejar": response.meta["cookiejar"]},
        )

    def parse_orders(self, response: Any) -> Any:
        jar = {"cookiejar": response.meta["cookiejar"]}
        yield from response.follow_all(css="a.order", callback=self.parse_order, meta=jar)
        yield from response.follow_all(css="a.next", callback=self.parse_orders, meta=jar)

    def parse_order(self, response: Any) -> Any:
        yield {"key": response.css("h1.order::text").get()}
