"""Scrapy's robots.txt fetch as scrapy-ha's retry middleware judges it.

``RobotsTxtMiddleware`` downloads a site's robots.txt itself (``engine.download``, not
through the scheduler): it is no request of the queue, so it is retried at once, as often
as Scrapy's ``RETRY_TIMES`` says, never dead-lettered, and a worker that gives up on it
says so at ERROR as Scrapy's retry middleware does. Scrapy then reads the last answer's
body as the site's rules (a 503's page: usually none), or, when no answer came, crawls
the site without rules.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy.utils.httpobj import urlparse_cached

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.http import Response

    from scrapy_ha.middlewares.policy import Failure

__all__ = ["gave_up", "is_robots_txt", "no_robots_txt"]

logger = logging.getLogger(__name__)


def no_robots_txt(request: Request, response: Response) -> bool:
    """Whether *response* to Scrapy's robots.txt fetch says the site has none: a 4xx but
    429 (RFC 9309: "unavailable", crawl as without rules; a 403 too). Scrapy's middleware
    goes on as it would, nothing counts ``ha/retry/gave_up``, and it is not fetched again
    (the proxy middleware, which sees the answer first, still rotates on a 403); a 5xx or
    a 429 is still a failure."""
    status = response.status
    return 400 <= status < 500 and status != 429 and is_robots_txt(request)  # noqa: PLR2004


def is_robots_txt(request: Request) -> bool:
    """Whether *request* is Scrapy's fetch of a site's robots.txt (RobotsTxtMiddleware
    marks it ``dont_obey_robotstxt``; a page of the crawl at that path is judged as any)."""
    return bool(request.meta.get("dont_obey_robotstxt")) and (
        urlparse_cached(request).path == "/robots.txt"
    )


def gave_up(request: Request, failure: Failure, retries: int) -> None:
    """Log a robots.txt fetch given up on after its *retries* (Scrapy's wording, at ERROR:
    before, a robots.txt that answered 503 each time left no line in the log)."""
    then = "its body is read as the rules" if failure.status else "the site has no rules"
    logger.error(
        "Gave up retrying %s (failed %d times): %s (%s)",
        request,
        retries + 1,
        failure.reason,
        then,
    )
