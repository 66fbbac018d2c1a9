"""A crawl's dead-letter queue from Python: ``DeadLetterQueue``, ``DeadEntry``, ``parse_entry``.

The documented import path; the implementation is in :mod:`scrapy_ha.deadletters.dlq`.
"""

from scrapy_ha.deadletters.dlq import (
    SCAN_BATCH,
    DeadEntry,
    DeadLetterQueue,
    parse_entry,
)

__all__ = [
    "DeadEntry",
    "DeadLetterQueue",
    "SCAN_BATCH",
    "parse_entry",
]
