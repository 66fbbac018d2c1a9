"""``ParentLeaseMiddleware``: every request a callback yields carries its page's lease.

The scheduler enqueues a child only while the lease of the page that yielded it is still
held (a worker that stalled past its leases cannot add work to a crawl it no longer owns,
nor bring a finished crawl back to life), and a child that cannot be stored fails its
parent instead of vanishing. Both need to know the parent: this spider middleware writes
its lease ``(entry id, token)`` into ``meta["_ha_parent"]`` (never stored in Redis).

The add-on puts it at order 10, outermost of the spider middlewares, so that it also sees
the requests other middlewares add (next pages of a checkpointed task, say).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.spidermiddlewares.base import BaseSpiderMiddleware

from scrapy_ha import metakeys

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.http import Response


__all__ = ["ParentLeaseMiddleware"]


class ParentLeaseMiddleware(BaseSpiderMiddleware):
    """Spider middleware: tag each yielded request with the lease of the page that yielded it."""

    def get_processed_request(self, request: Request, response: Response | None) -> Request:
        page = response.request if response is not None else None
        lease = page.meta.get(metakeys.LEASE) if page is not None else None
        if lease is not None and request is not page:
            request.meta[metakeys.PARENT] = lease
        return request
