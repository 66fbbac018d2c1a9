"""scrapy-ha: highly available distributed Scrapy crawls around one Redis."""

from __future__ import annotations

from scrapy_ha._version import __version__
from scrapy_ha.addon import Addon
from scrapy_ha.scheduler import Scheduler

__all__ = ["Addon", "Scheduler", "__version__"]
