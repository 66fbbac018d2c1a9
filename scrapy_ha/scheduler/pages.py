"""The browser page a request's attempt left open, closed when the request goes back to Redis.

scrapy-playwright, asked for the page (``meta["playwright_include_page"] = True``), puts the
Playwright page of the attempt in ``meta["playwright_page"]`` and leaves it open for the
callback or the errback to close. Under Scrapy's own scheduler a retry is a copy of the
request in the same process, whose next attempt downloads in that very page. A request that
goes back to Redis (a retry, a revisit, a dead letter) is stored without it (the page cannot
be stored, and the next attempt may be another worker's), so nothing would close it: each
retried page would stay open until the browser context closes, and once
``PLAYWRIGHT_MAX_PAGES_PER_CONTEXT`` of them are left, every later request of the context
waits for a page for ever. So the page is closed here once the request is finished (its
callback or errback has run), unless it is closed already.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scrapy import Request

logger = logging.getLogger(__name__)

#: the meta key scrapy-playwright puts the attempt's page in
PAGE_KEY = "playwright_page"


def close_left_page(request: Request) -> None:
    """Close the browser page *request*'s attempt left open, if any (in the background)."""
    page = request.meta.get(PAGE_KEY)
    is_closed = getattr(page, "is_closed", None)
    if page is None or not callable(is_closed) or is_closed():
        return
    try:
        closing = asyncio.ensure_future(page.close())
    except Exception as exc:  # no running loop, or not a Playwright page after all
        logger.debug("Could not close the page of %s: %r", request, exc)
        return
    closing.add_done_callback(lambda task: _said(request, task))


def _said(request: Request, task: asyncio.Future[Any]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        logger.debug("Could not close the page of %s: %r", request, exc)
