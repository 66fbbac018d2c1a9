"""The retry middlewares: ``RetryMiddleware`` (downloader) and ``ParseErrorMiddleware``
(spider), and ``PermanentError`` for a callback's failure that must not be retried.

The documented import path; the implementation is :mod:`scrapy_ha.middlewares.retry`.
"""

from scrapy_ha.middlewares.retry import (
    CLASS_DEFAULTS,
    HISTORY_LIMIT,
    Failure,
    FailureClass,
    ParseErrorMiddleware,
    PermanentError,
    Policy,
    RetryConfig,
    RetryMiddleware,
    Verdict,
    decide,
    retry_after_seconds,
)

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
