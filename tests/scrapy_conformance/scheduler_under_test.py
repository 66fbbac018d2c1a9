"""The scheduler class Scrapy's scheduler unit tests build (scrapy-ha's, or Scrapy's own
with ``SCRAPY_HA_CONFORMANCE_BASELINE=1``, to check that a failure is scrapy-ha's)."""

from __future__ import annotations

import os

from scrapy.core.scheduler import Scheduler as ScrapyScheduler

from scrapy_ha import Scheduler as ScrapyHAScheduler

BASELINE_ENV = "SCRAPY_HA_CONFORMANCE_BASELINE"

Scheduler: type = ScrapyScheduler if os.environ.get(BASELINE_ENV) == "1" else ScrapyHAScheduler
