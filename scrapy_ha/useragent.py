"""The optional User-Agent pool: ``UserAgentPoolMiddleware``.

The documented import path; the implementation is in :mod:`scrapy_ha.middlewares.useragent`.
"""

from scrapy_ha.middlewares.useragent import (
    UserAgentPoolMiddleware,
)

__all__ = [
    "UserAgentPoolMiddleware",
]
