"""scrapy-ha: highly available distributed Scrapy crawls around one Redis."""

from __future__ import annotations

__version__ = "0.1.0"

from scrapy_ha.addon import Addon  # noqa: E402
from scrapy_ha.scheduler import Scheduler  # noqa: E402

__all__ = ["Addon", "Scheduler", "__version__"]
