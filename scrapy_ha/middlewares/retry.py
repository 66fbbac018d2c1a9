"""Crawler-aware retries: every failure is classified into a delayed exponential retry
or the dead-letter queue.

``RetryMiddleware`` (a downloader middleware; the add-on puts it in place of Scrapy's
``RetryMiddleware`` at 550) classifies responses and download exceptions;
``ParseErrorMiddleware`` (a spider middleware) classifies exceptions raised by callbacks
and by the item pipelines (``item_error``).
Neither sleeps: a retry is returned to Scrapy as a copy of the request carrying its
verdict, and the scheduler moves the original's lease to the delayed set atomically,
so the downloader slot is freed at once and the retry survives any worker dying.

Failure classes, each with its own budget and backoff:

============  ==============================================  ===========================
class         what                                            default
============  ==============================================  ===========================
network       timeouts, DNS, refused/reset, data loss, tunnel  5 retries from 1 s
server        5xx, 408 (522, 524 are 5xx)                      5 retries from 3 s
rate_limited  429, 503 with Retry-After                        5 retries, Retry-After first;
                                                               the domain is closed for all
banned        403, or the user's ban check                     3 retries (proxy rotated)
parse         an exception from the callback                   2 retries from 10 s
pipeline      an exception from an item pipeline (not DropItem) 5 retries from 1 s; the page
                                                               is crawled again
gone          404, 410                                         dead-letter at once
client        other 4xx                                        dead-letter at once
permanent     exception types the user lists                   dead-letter at once
============  ==============================================  ===========================
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import (
    DownloadCancelledError,
    IgnoreRequest,
    NotConfigured,
    StopDownload,
)
from scrapy.http import Response
from scrapy.spidermiddlewares.httperror import HttpError
from twisted.internet import defer
from twisted.python.failure import Failure as TwistedFailure

from scrapy_ha import metakeys
from scrapy_ha.config.retry import RetryConfig
from scrapy_ha.config.startup import configured
from scrapy_ha.middlewares.policy import (
    Failure,
    decide,
    error_verdict,
    retry_after_seconds,
    through_proxy,
)
from scrapy_ha.middlewares.reasons import exception_reason
from scrapy_ha.middlewares.registry import CrawlScheduler, scheduler_for
from scrapy_ha.middlewares.robots import gave_up, is_robots_txt, no_robots_txt
from scrapy_ha.verdict import FailureClass, Verdict

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from typing import Self

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler

__all__ = ["ParseErrorMiddleware", "RetryMiddleware"]

logger = logging.getLogger(__name__)

#: Exceptions of a download that are no failure of the request: a middleware dropped it on
#: purpose (robots.txt, off-site), a signal handler stopped its download, or the download
#: was cancelled (Scrapy's ``DownloadCancelledError``, which a page past DOWNLOAD_MAXSIZE
#: also raises: acked as done, as before). Any other exception no failure class names
#: dead-letters the request as ``permanent``.
NOT_FAILURES: tuple[type[BaseException], ...] = (
    IgnoreRequest,
    StopDownload,
    DownloadCancelledError,
    defer.CancelledError,
)

#: Characters of an item shown in a warning (items can be large).
SHORT_ITEM = 200


class RetryMiddleware:
    """Downloader middleware: classify responses and download errors; retry later or give up.

    A retry leaves as a copy of the request (``dont_filter``) with its :class:`Verdict` in
    ``meta["ha_outcome"]``;
    the scheduler turns it into a delayed retry of the original entry. A request given up on
    goes on to the spider (its errback sees the error as usual) and is dead-lettered when
    Scrapy has finished with it. ``dont_retry`` in meta switches all of this off.
    """

    def __init__(self, crawler: Crawler, config: RetryConfig) -> None:
        self.crawler = crawler
        self.config = config
        self.stats = crawler.stats

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        if not configured(crawler, RetryConfig.switched_on):
            raise NotConfigured  # switched off: silent, as Scrapy's own RetryMiddleware
        return cls(crawler, configured(crawler, RetryConfig.from_settings))

    def process_response(self, request: Request, response: Response) -> Request | Response:
        if request.meta.get("dont_retry"):
            return response
        try:
            return self._judge_response(request, response)
        except Exception as exc:  # noqa: BLE001 - a bug or garbage costs this request alone
            _judged_in_error(self.crawler, request, exc)
            # dead-lettered: the callback must not run too (a requeue would do it twice)
            raise IgnoreRequest(
                f"{request}: dead-lettered, its answer could not be judged"
            ) from exc

    def process_exception(self, request: Request, exception: Exception) -> Request | None:
        if request.meta.get("dont_retry"):
            return None
        try:
            return self._judge_exception(request, exception)
        except Exception as exc:  # noqa: BLE001 - a bug or garbage costs this request alone
            _judged_in_error(self.crawler, request, exc)
            return None

    def _judge_response(self, request: Request, response: Response) -> Request | Response:
        fclass = self.config.classify_response(response)
        if fclass is None or self._allowed_status(request, response):
            return response
        if no_robots_txt(request, response):
            return response  # RFC 9309: a 4xx robots.txt is "no rules", no failure
        failure = Failure(
            fclass,
            f"HTTP {response.status}",
            status=response.status,
            retry_after=retry_after_seconds(response, _who_and_when(self.crawler)[1] / 1e3),
        )
        return self._handle(request, failure) or response

    def _gate_seconds(self, request: Request, failure: Failure, verdict: Verdict) -> float:
        """How long a rate-limited answer closes its domain: the retry's delay; with no
        retry left, the site's ``Retry-After``, else the class's backoff ceiling for this
        attempt (capped by ``HA_RETRY_AFTER_MAX`` either way)."""
        if verdict.delay is not None:
            return verdict.delay
        if failure.retry_after is not None:
            return min(failure.retry_after, self.config.retry_after_max)
        made = verdict.attempts  # (a count meta held as garbage, inf: the first backoff)
        attempt = made - 1 if isinstance(made, int) and made > 0 else 0
        policy = self.config.policies[FailureClass.RATE_LIMITED]
        return min(policy.ceiling(attempt), self.config.retry_after_max)

    def _judge_exception(self, request: Request, exception: Exception) -> Request | None:
        fclass = self.config.classify_exception(exception)
        reason = exception_reason(exception, request.url)  # with its message (.reasons)
        reason += through_proxy(request) if fclass == FailureClass.NETWORK else ""
        if fclass is None:
            if isinstance(exception, NOT_FAILURES):
                return None
            # an exception no class names (a meta value of the wrong type, a middleware's
            # bug): acked as done it was lost, with one "Error downloading" line; retried it
            # would fail the same way. Dead-lettered, it can be read and requeued once fixed.
            fclass = FailureClass.PERMANENT
        retry = self._handle(request, Failure(fclass, reason))
        if retry is None and request.errback is not None:
            request.errback = _WatchedErrback(request, request.errback)
        return retry

    def _handle(self, request: Request, failure: Failure) -> Request | None:
        worker, now_ms = _who_and_when(self.crawler)
        if is_robots_txt(request):  # downloaded again at once, not through Redis: as Scrapy
            limited = failure.failure_class == FailureClass.RATE_LIMITED  # (the gate waits)
            request.meta[metakeys.RETRY_TIMES] = 0 if limited else self.config.robots_retries
        fclass = failure.failure_class
        scheduler = scheduler_for(self.crawler)
        meta = request.meta
        if fclass == FailureClass.RATE_LIMITED and scheduler is not None:
            free = not (is_robots_txt(request) or meta.get(metakeys.GATE_WAITED))
            if free and (wait := scheduler.closed.sent_before(request)) > 0:
                return self._wait_for_gate(request, failure, wait, scheduler)
        meta.pop(metakeys.GATE_WAITED, None)  # an attempt: the next gate may be waited for
        verdict = decide(request, failure, self.config, worker=worker, now_ms=now_ms)
        if fclass == FailureClass.RATE_LIMITED and scheduler is not None:
            # the site's wait holds for its domain whether or not this request has a retry
            # left (a 429 that spent the budget closed no gate: the next went at full speed)
            gate = self._gate_seconds(request, failure, verdict)
            if gate:
                scheduler.close_gate(request, gate)
        if verdict.delay is None:
            self.stats.inc_value(f"ha/retry/gave_up/{fclass}")
            if is_robots_txt(request):
                gave_up(request, failure, meta[metakeys.RETRY_TIMES])
            return None
        self.stats.inc_value("ha/retry/count")
        self.stats.inc_value(f"ha/retry/{fclass}")
        logger.debug(
            "Retrying %s in %.1f s (%s, %s)", request, verdict.delay, fclass, failure.reason
        )
        return request.replace(dont_filter=True)

    def _wait_for_gate(
        self, request: Request, failure: Failure, wait: float, scheduler: CrawlScheduler
    ) -> Request:
        """A 429 to a request that was downloading when its domain's gate closed: the
        site's answer to a request sent too soon, which the gate now holds back. It waits
        for the gate as the domain's queued requests do, without an attempt (no retry
        counted, its budget whole); its ``Retry-After`` may keep the gate closed longer.
        Once between two attempts (``meta["ha_gate_waited"]``, stored with it): a review
        found a domain that answers 429 to everything downloaded about as many times more
        than its budget as requests ran at once, each of them waiting at every reopening.
        Before, each request in flight when a 429 came spent an attempt on its own 429."""
        if failure.retry_after is not None:
            scheduler.close_gate(request, min(failure.retry_after, self.config.retry_after_max))
        gate = Verdict.retry(FailureClass.GATE, failure.reason, wait, status=failure.status)
        request.meta[metakeys.OUTCOME] = gate
        request.meta[metakeys.GATE_WAITED] = True
        self.stats.inc_value("ha/retry/gate_waits")
        logger.debug("%s waits %.1f s for its domain's gate (%s)", request, wait, failure.reason)
        return request.replace(dont_filter=True)

    def _allowed_status(self, request: Request, response: Response) -> bool:
        """True if the spider asked to handle this status itself (HttpErrorMiddleware's rules)."""
        meta = request.meta
        if meta.get("handle_httpstatus_all"):
            return True
        allowed = meta.get("handle_httpstatus_list")
        if allowed is None and self.config.allow_all:  # HTTPERROR_ALLOW_ALL
            return True
        if allowed is None:
            allowed = getattr(self.crawler.spider, "handle_httpstatus_list", None) or []
            allowed = [*allowed, *self.config.allowed_codes]
        if response.status in allowed:  # (as HttpErrorMiddleware asks: any container)
            return True
        try:  # codes stored as strings
            return response.status in [int(x) for x in allowed]
        except TypeError:  # a container that cannot be listed (scrapy fetch and shell put
            return False  # SequenceExclude(range(300, 400)) there: every status but 3xx)


class ParseErrorMiddleware:
    """Spider middleware: an exception from a callback retries the page later, then
    dead-letters it (class ``parse``); :class:`PermanentError` and the types in
    ``HA_RETRY_PERMANENT_EXCEPTIONS`` dead-letter it at once. The exception is still
    logged by Scrapy as usual.

    An exception from an item pipeline (``item_error``, not ``DropItem``) does the same
    for the page that yielded the item (class ``pipeline``): the page is crawled again
    later, so the item is not lost while, say, the database is down. Scrapy 2.19 sends
    ``item_error`` while the page is still unfinished in the engine (its items go
    through the pipelines before the scraper lets go of it), so the verdict reaches
    the scheduler before the page would be acked."""

    def __init__(self, crawler: Crawler, config: RetryConfig) -> None:
        self.crawler = crawler
        self.config = config
        crawler.signals.connect(self._item_error, signal=signals.item_error)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        if not configured(crawler, RetryConfig.switched_on):
            raise NotConfigured  # switched off: silent, as Scrapy's own RetryMiddleware
        return cls(crawler, configured(crawler, RetryConfig.from_settings))

    async def process_spider_output(
        self, response: Response, result: AsyncIterator[Any], spider: Spider | None = None
    ) -> AsyncIterator[Any]:
        """Pass the output on; note when the errback of a given-up request handled it."""
        async for x in result:
            yield x
        request = response.request
        if request is None or request.errback is None or response.status < 300:
            return
        verdict = Verdict.from_meta(request.meta)
        if verdict is not None and not verdict.is_retry:
            # the spider's errback had its say: no ERROR for it
            request.meta[metakeys.OUTCOME] = verdict.handled_by_errback()

    def process_spider_exception(
        self, response: Response, exception: Exception, spider: Spider | None = None
    ) -> None:
        request = response.request
        if request is None or request.meta.get("dont_retry"):
            return
        if metakeys.OUTCOME in request.meta or isinstance(exception, _NOT_PARSE_ERRORS):
            return  # judged by RetryMiddleware already (an HTTP error), or not a parse error
        permanent = isinstance(exception, self.config.permanent_exceptions)
        self._judge(request, FailureClass.PERMANENT if permanent else FailureClass.PARSE, exception)

    def _item_error(
        self, item: Any, response: Any = None, failure: Any = None, **kwargs: Any
    ) -> None:
        request = response.request if isinstance(response, Response) else None
        if request is None or request.meta.get("dont_retry"):
            logger.warning(
                "Item %r failed in the pipelines and cannot be retried (it comes "
                "from no downloaded page, or the page has dont_retry)",
                _short(item),
            )
            return
        if metakeys.OUTCOME in request.meta:
            return  # the page is judged already (another of its items, or its callback)
        exception = getattr(failure, "value", None) or RuntimeError("item pipeline error")
        self._judge(request, FailureClass.PIPELINE, exception)

    def _judge(self, request: Request, fclass: FailureClass, exception: BaseException) -> None:
        try:
            self._decide(request, fclass, exception)
        except Exception as exc:  # noqa: BLE001 - a bug or garbage costs this request alone
            _judged_in_error(self.crawler, request, exc)

    def _decide(self, request: Request, fclass: FailureClass, exception: BaseException) -> None:
        worker, now_ms = _who_and_when(self.crawler)
        failure = Failure(fclass, exception_reason(exception))
        verdict = decide(request, failure, self.config, worker=worker, now_ms=now_ms)
        if verdict.is_retry:
            self.crawler.stats.inc_value("ha/retry/count")
            self.crawler.stats.inc_value(f"ha/retry/{fclass}")
        else:
            self.crawler.stats.inc_value(f"ha/retry/gave_up/{fclass}")


class _WatchedErrback:
    """The spider's errback of a download error given up on, noting in the request's
    verdict that it handled the error (it returned), so that the dead letter is logged at
    INFO and says ``"errback": true``, as for an HTTP error.

    Scrapy 2.19 calls the errback of a download error directly from the scraper, outside
    the spider middlewares (``Scraper._scrape``), so no middleware sees it succeed. The
    spider's own method is put back on the request before it runs; until then this
    stands in for it with its ``__name__`` and ``__func__``, so that a request stored
    before the call (another middleware made a copy of it) stores the spider's method."""

    def __init__(self, request: Request, errback: Callable[[TwistedFailure], Any]) -> None:
        self.request = request
        self.errback = errback
        self.__name__ = getattr(errback, "__name__", "")
        self.__func__ = getattr(errback, "__func__", errback)

    def __call__(self, failure: TwistedFailure) -> Any:
        request = self.request
        request.errback = self.errback
        output = self.errback(failure)  # raising: not handled, Scrapy logs it as usual
        if isinstance(output, TwistedFailure):
            return output  # handed back: Scrapy raises it, as unhandled
        verdict = Verdict.from_meta(request.meta)
        if verdict is not None and not verdict.is_retry:
            request.meta[metakeys.OUTCOME] = verdict.handled_by_errback()
        return output


def _who_and_when(crawler: Crawler) -> tuple[str, int]:
    """This worker's id and the Redis server's clock (the local clock without scrapy-ha's
    scheduler). ``is None``: the scheduler has a length, and an empty one is falsy."""
    scheduler = scheduler_for(crawler)
    if scheduler is None:
        return "", int(time.time() * 1000)
    return scheduler.config.worker_id, scheduler.server_time_ms()


def _judged_in_error(crawler: Crawler, request: Request, error: Exception) -> None:
    """A failure the policy could not judge: dead-lettered (class ``error``), logged, counted."""
    verdict = error_verdict(request, error)
    crawler.stats.inc_value(f"ha/retry/gave_up/{verdict.failure_class}")
    logger.error("Could not judge the failure of %s: %s", request, verdict.reason, exc_info=error)


def _short(item: Any) -> str:
    return repr(item)[:SHORT_ITEM]


#: Exceptions a callback's output may carry that are no parse error: an HTTP error that
#: RetryMiddleware judged already, or a request the spider chose to ignore.
_NOT_PARSE_ERRORS = (HttpError, IgnoreRequest)
