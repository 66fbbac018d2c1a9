"""A revisited page that the site redirects (``/redirect/3`` to ``/item/3``): its target is
carried under the page's lease (scheduler/carry.py). With ``-a hang=1`` the target's callback
says ``TARGET IN FLIGHT`` and blocks, for a test to SIGKILL the worker then.

Run with ``scrapy runspider tests/carried_spider.py -a base_url=... -s REDIS_URL=...``.
"""

from __future__ import annotations

import time
from typing import Any

import scrapy


class CarriedSpider(scrapy.Spider):
    name = "carried"
    custom_settings = {  # noqa: RUF012 (Scrapy's own attribute)
        "ADDONS": {"scrapy_ha.Addon": 0},
        "HA_LEASE_TIME": 3,
        "HA_LEASE_RENEW_INTERVAL": 0.5,
        "HA_HEARTBEAT_TTL": 3,
        "HA_RECLAIM_INTERVAL": 1,
        "HA_IDLE_TIMEOUT": 0.3,
        "LOG_LEVEL": "INFO",
    }

    def __init__(self, base_url: str = "", hang: str = "0", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base_url = base_url
        self.hang = hang == "1"

    async def start(self) -> Any:
        meta = {"ha_revisit": 1.0}
        yield scrapy.Request(self.base_url + "/redirect/3", meta=meta, dont_filter=True)

    def parse(self, response: Any) -> Any:
        if self.hang:
            self.logger.warning("TARGET IN FLIGHT: %s", response.url)
            time.sleep(600)  # the worker is SIGKILLed meanwhile
        yield {"id": int(response.css("span.id::text").get())}
