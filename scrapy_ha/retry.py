"""The retry middlewares: ``RetryMiddleware`` (downloader) and ``ParseErrorMiddleware``
(spider), and ``PermanentError`` for a callback's failure that must not be retried.

The documented import path; the implementation is :mod:`scrapy_ha.middlewares.retry`.
"""

from scrapy_ha.config.middlewares import RetryConfig
from scrapy_ha.middlewares.policy import (
    CLASS_DEFAULTS,
    HISTORY_LIMIT,
    Failure,
    PermanentError,
    Policy,
    decide,
    retry_after_seconds,
)
from scrapy_ha.middlewares.retry import ParseErrorMiddleware, RetryMiddleware
from scrapy_ha.verdict import FailureClass, Verdict

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
