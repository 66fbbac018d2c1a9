"""The parent-lease middleware: ``ParentLeaseMiddleware`` tags every request a callback
yields with its page's lease (the add-on installs it; a project that lists its middlewares
itself names it here).

The documented import path; the implementation is in :mod:`scrapy_ha.middlewares.parent`.
"""

from scrapy_ha.middlewares.parent import ParentLeaseMiddleware

__all__ = ["ParentLeaseMiddleware"]
