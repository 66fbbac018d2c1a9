"""Cookie jars shared by every worker: ``SharedCookiesMiddleware`` and
``CookieVersionMiddleware``.

The documented import path; the implementation is in :mod:`scrapy_ha.middlewares.cookies`.
"""

from scrapy_ha.middlewares.cookies import (
    CookieVersionMiddleware,
    SharedCookiesMiddleware,
)

__all__ = [
    "CookieVersionMiddleware",
    "SharedCookiesMiddleware",
]
