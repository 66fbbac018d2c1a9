"""An exception while ending one finished request costs that request alone, not the
worker's round (scheduler/inflight.py ``collect_finished``): before, it escaped every round
that collected it (``HA_REVISIT_MAX = inf`` divided by zero in each revisit's end), the
round stopped before renewing the worker's leases, and pages were reclaimed in a loop."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from scrapy.utils.defer import deferred_f_from_coro_f
from scrapy.utils.request import RequestFingerprinter
from scrapy.utils.test import get_crawler

from tests.cli_seed import scrapy_ha
from tests.spiders import CatalogueSpider
from tests.test_revisits import CONTINUOUS

#: the engine looks at the scheduler every 0.2 s instead of 5 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_engine_heartbeat")


class FailsAtTheEndOfItem3:
    """Scrapy's fingerprinter, except that it fails for /item/3 once its visit ended (its
    revisit state set): a bug that shows only when a request is ended."""

    def __init__(self) -> None:
        self.inner = RequestFingerprinter()

    def fingerprint(self, request: Any) -> bytes:
        if "ha_revisit_state" in request.meta and request.url.endswith("/item/3"):
            raise ValueError("a fingerprinter bug")
        return self.inner.fingerprint(request)


@deferred_f_from_coro_f
async def test_a_request_whose_end_fails_costs_itself_alone(redis_url, site, caplog):
    caplog.set_level(logging.INFO)
    settings = {**CONTINUOUS, "REDIS_URL": redis_url, "HA_REVISIT": {r"/item/": 600}}
    settings["REQUEST_FINGERPRINTER_CLASS"] = f"{__name__}.FailsAtTheEndOfItem3"
    settings["HA_ITEMS"] = "outbox"
    crawler = get_crawler(CatalogueSpider, settings)
    crawling = asyncio.ensure_future(crawler.crawl_async(base_url=site.url))
    await asyncio.sleep(6)
    # what the failed end left to go with it is forgotten (its items were kept for ever)
    outbox = crawler.engine._slot.scheduler.outbox
    assert not [pair for pair in outbox.commits if pair not in outbox.acks], outbox.commits
    stopped = await asyncio.to_thread(scrapy_ha, "stop", "catalogue", "--redis-url", redis_url)
    assert stopped.returncode == 0, stopped.stderr
    await asyncio.wait_for(crawling, 30)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not [m for m in errors if "background loop error" in m]  # no round was cut short
    assert [m for m in errors if m.startswith("scrapy-ha could not end <GET ") and "/item/3>" in m]
    assert crawler.stats.get_value("ha/revisit/scheduled") == 49  # every other item page
    assert crawler.stats.get_value("ha/op_errors") >= 1
