"""The retry middlewares: ``RetryMiddleware`` (downloader) and ``ParseErrorMiddleware``
(spider), and ``PermanentError`` for a callback's failure that must not be retried.

The documented import path; the implementation is in :mod:`scrapy_ha.middlewares.retry`,
:mod:`scrapy_ha.middlewares.policy` and :mod:`scrapy_ha.config.retry`.
"""

from scrapy_ha.config.retry import CLASS_DEFAULTS, Policy, RetryConfig
from scrapy_ha.middlewares.policy import HISTORY_LIMIT, Failure, decide, retry_after_seconds
from scrapy_ha.middlewares.retry import ParseErrorMiddleware, RetryMiddleware
from scrapy_ha.verdict import FailureClass, PermanentError, Verdict

__all__ = [
    "CLASS_DEFAULTS",
    "Failure",
    "FailureClass",
    "HISTORY_LIMIT",
    "ParseErrorMiddleware",
    "PermanentError",
    "Policy",
    "RetryConfig",
    "RetryMiddleware",
    "Verdict",
    "decide",
    "retry_after_seconds",
]
