"""Crawl-wide numbers read from Redis: ``read_crawl_stats`` and ``CrawlStats``.

The documented import path; the implementation is in :mod:`scrapy_ha.ops.stats`.
"""

from scrapy_ha.ops.stats import (
    COUNTERS,
    DOMAIN_EVENTS,
    MINUTE_EVENTS,
    CrawlStats,
    read_crawl_stats,
    read_crawl_stats_async,
)

__all__ = [
    "COUNTERS",
    "CrawlStats",
    "DOMAIN_EVENTS",
    "MINUTE_EVENTS",
    "read_crawl_stats",
    "read_crawl_stats_async",
]
