"""Cookie jars shared by every worker: ``SharedCookiesMiddleware`` and
``CookieVersionMiddleware``, and ``login_once``
(one login per expiry of a shared session).

The documented import path; the implementation is in :mod:`scrapy_ha.middlewares.cookies`.
"""

from scrapy_ha.middlewares.cookies import (
    CookieVersionMiddleware,
    SharedCookiesMiddleware,
)
from scrapy_ha.middlewares.logins import LoginFailed, login_once

__all__ = [
    "CookieVersionMiddleware",
    "LoginFailed",
    "SharedCookiesMiddleware",
    "login_once",
]
