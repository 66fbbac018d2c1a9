"""The static-site benchmark's spider: / -> list pages -> detail pages, as bench/spider.py,
and it keeps the time of every response, so that the benchmark can take the rate in the
middle of the crawl (start-up, the first pages and the end left out).

At close it writes ``{"pages", "seconds", "middle_rate", "reason"}`` to the BENCH_OUT file.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import scrapy

if TYPE_CHECKING:
    from collections.abc import Iterator

#: The middle of the crawl: the responses between these fractions of all of them.
MIDDLE = (0.25, 0.75)


def middle_rate(times: list[float]) -> float:
    """Responses per second between the first and the last of the middle half of *times*."""
    if len(times) < 4:
        return 0.0
    first, last = (int(len(times) * f) for f in MIDDLE)
    seconds = times[last] - times[first]
    return (last - first) / seconds if seconds > 0 else 0.0


class StaticBenchSpider(scrapy.Spider):
    name = "static-bench"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/"]
        self.times: list[float] = []

    def parse(self, response: Any) -> Iterator[Any]:
        self.times.append(time.monotonic())
        for href in response.css("a.item::attr(href)").getall():
            yield response.follow(href, callback=self.parse_item)
        for href in response.css("a.next::attr(href)").getall():
            yield response.follow(href, callback=self.parse)

    def parse_item(self, response: Any) -> Iterator[dict[str, Any]]:
        self.times.append(time.monotonic())
        yield {"id": response.css("span.id::text").get()}

    def closed(self, reason: str) -> None:
        out = self.settings.get("BENCH_OUT")
        if not out:
            return
        with open(out, "w") as f:
            json.dump(
                {
                    "pages": len(self.times),
                    "seconds": self.times[-1] - self.times[0] if self.times else 0.0,
                    "middle_rate": middle_rate(self.times),
                    "reason": reason,
                },
                f,
            )
