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
import random
import time
from dataclasses import dataclass, replace
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Response
from scrapy.spidermiddlewares.httperror import HttpError
from scrapy.utils.misc import load_object
from scrapy.utils.python import global_object_name

from scrapy_ha import metakeys
from scrapy_ha.codec import strip_credentials
from scrapy_ha.config import ConfigError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from typing import Self

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)

#: Attempts kept in a request's history (bounds its size in Redis).
HISTORY_LIMIT = 10

#: Retry-After is honoured up to this many seconds (Crawlee caps its per-domain backoff too).
DEFAULT_RETRY_AFTER_MAX = 600.0
#: Fraction of the backoff that is random: 1.0 is "full jitter" (0 .. backoff).
DEFAULT_JITTER = 1.0
#: Priority change per retry: Scrapy's RETRY_PRIORITY_ADJUST default (fresh work first).
DEFAULT_PRIORITY_ADJUST = -1


class PermanentError(Exception):
    """Raise from a callback for a failure that no retry can fix: dead-lettered at once."""


@dataclass(frozen=True)
class Policy:
    """Budget and backoff of one failure class: delay = base × multiplier^n, capped."""

    times: int = 5
    base: float = 3.0
    multiplier: float = 2.0
    max: float = 120.0

    def backoff(self, attempt: int, jitter: float, rand: Callable[[], float]) -> float:
        cap = min(self.max, self.base * self.multiplier**attempt)
        return cap * (1 - jitter * rand())


#: How each class differs from the global policy (HA_RETRY_TIMES, HA_RETRY_BACKOFF_*).
CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "network": {"base": 1.0},  # a dropped connection is usually fine a second later
    "server": {},
    "rate_limited": {},
    "banned": {"times": 3},  # its own budget: a proxy rotation each time
    "parse": {"times": 2, "base": 10.0},
    "pipeline": {"base": 1.0},  # a database write that failed: retry soon
    "gone": {"times": 0},
    "client": {"times": 0},
    "permanent": {"times": 0},
}

DEFAULT_STATUS_CLASSES: dict[int, str] = {
    403: "banned",
    404: "gone",
    408: "server",
    410: "gone",
    429: "rate_limited",
}


@dataclass(frozen=True)
class RetryConfig:
    """The retry settings, validated."""

    policies: dict[str, Policy]
    status_classes: dict[int, str | None]
    network_exceptions: tuple[type[BaseException], ...]
    permanent_exceptions: tuple[type[BaseException], ...]
    ban_check: Callable[[Response], bool] | None = None
    retry_after_max: float = DEFAULT_RETRY_AFTER_MAX
    jitter: float = DEFAULT_JITTER
    priority_adjust: int = DEFAULT_PRIORITY_ADJUST

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        base = Policy(
            times=_int(settings, "HA_RETRY_TIMES", 5),
            base=_float(settings, "HA_RETRY_BACKOFF_BASE", 3.0),
            multiplier=_float(settings, "HA_RETRY_BACKOFF_MULTIPLIER", 2.0),
            max=_float(settings, "HA_RETRY_BACKOFF_MAX", 120.0),
        )
        jitter = _float(settings, "HA_RETRY_JITTER", DEFAULT_JITTER)
        if jitter > 1:
            raise ConfigError(f"HA_RETRY_JITTER={jitter!r} must be between 0 and 1")
        return cls(
            policies=_policies(settings, base),
            status_classes=_status_classes(settings),
            network_exceptions=_load_all(settings, "RETRY_EXCEPTIONS"),
            permanent_exceptions=(
                PermanentError,
                *_load_all(settings, "HA_RETRY_PERMANENT_EXCEPTIONS"),
            ),
            ban_check=_optional_callable(settings, "HA_BAN_CHECK"),
            retry_after_max=_float(settings, "HA_RETRY_AFTER_MAX", DEFAULT_RETRY_AFTER_MAX),
            jitter=jitter,
            priority_adjust=settings.getint("RETRY_PRIORITY_ADJUST", DEFAULT_PRIORITY_ADJUST),
        )

    def classify_response(self, response: Response) -> str | None:
        """The failure class of a response, or None if it is a success."""
        if self.ban_check is not None and self.ban_check(response):
            return "banned"
        status = response.status
        if status in self.status_classes:
            return self.status_classes[status]
        if status == 503 and b"Retry-After" in response.headers:
            return "rate_limited"
        if status >= 500:
            return "server"
        if status >= 400:
            return "client"
        return None

    def classify_exception(self, exception: BaseException) -> str | None:
        """The failure class of an exception, or None if it is not a failure to handle."""
        if isinstance(exception, self.permanent_exceptions):
            return "permanent"
        if isinstance(exception, self.network_exceptions):
            return "network"
        return None


@dataclass(frozen=True)
class Failure:
    """One failed attempt, as the retry logic sees it."""

    cls: str
    reason: str
    status: int | None = None
    retry_after: float | None = None


def decide(
    request: Request,
    failure: Failure,
    config: RetryConfig,
    *,
    worker: str,
    now_ms: int,
    rand: Callable[[], float] = random.random,
) -> dict[str, Any]:
    """Record the attempt in *request*'s meta and set its verdict (``ha_outcome``).

    A retry changes ``request.priority`` by ``RETRY_PRIORITY_ADJUST`` (default -1), as
    Scrapy's own retries do, so that fresh work goes ahead of failures.

    Returns the verdict: ``{"op": "retry", "delay": seconds, ...}`` while the class's budget
    lasts, else ``{"op": "dead", ...}``.
    """
    meta = request.meta
    retries: dict[str, int] = dict(meta.get(metakeys.RETRIES) or {})
    attempt = retries.get(failure.cls, 0)
    policy = config.policies.get(failure.cls, Policy(times=0))
    budget = meta.get(metakeys.RETRY_TIMES, policy.times)
    history = list(meta.get(metakeys.HISTORY) or [])[-(HISTORY_LIMIT - 1) :]
    proxy = meta.get("proxy")
    history.append(
        {
            "t": now_ms,
            "class": failure.cls,
            "outcome": failure.reason,
            "worker": worker,
            "proxy": strip_credentials(proxy) if proxy else None,
        }
    )
    retries[failure.cls] = attempt + 1
    meta[metakeys.RETRIES] = retries
    meta[metakeys.HISTORY] = history
    verdict: dict[str, Any] = {"class": failure.cls, "reason": failure.reason}
    if failure.status is not None:
        verdict["status"] = failure.status
    if attempt >= budget:
        verdict["op"] = "dead"
        verdict["attempts"] = attempt + 1
    else:
        verdict["op"] = "retry"
        verdict["delay"] = _delay(failure, policy, attempt, config, rand)
        request.priority += config.priority_adjust
    meta[metakeys.OUTCOME] = verdict
    return verdict


def _delay(
    failure: Failure, policy: Policy, attempt: int, config: RetryConfig, rand: Callable[[], float]
) -> float:
    if failure.retry_after is not None:
        return min(failure.retry_after, config.retry_after_max) * (1 + 0.1 * config.jitter * rand())
    return policy.backoff(attempt, config.jitter, rand)


def retry_after_seconds(response: Response) -> float | None:
    """Retry-After in seconds (a number, or an HTTP date relative to the response's Date)."""
    value = response.headers.get(b"Retry-After")
    if not value:
        return None
    text = value.decode("latin-1").strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError):
        return None
    date = response.headers.get(b"Date")
    try:
        now = parsedate_to_datetime(date.decode("latin-1")).timestamp() if date else time.time()
    except (TypeError, ValueError):
        now = time.time()
    return max(0.0, when - now)


class RetryMiddleware:
    """Downloader middleware: classify responses and download errors; retry later or give up.

    A retry leaves as a copy of the request (``dont_filter``) with ``meta["ha_outcome"]``;
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
        if not crawler.settings.getbool("HA_RETRY_ENABLED", True):
            raise NotConfigured  # switched off: silent, as Scrapy's own RetryMiddleware
        return cls(crawler, RetryConfig.from_settings(crawler.settings))

    def process_response(self, request: Request, response: Response) -> Request | Response:
        if request.meta.get("dont_retry"):
            return response
        cls = self.config.classify_response(response)
        if cls is None or _allowed_status(request, response, self.crawler):
            return response
        failure = Failure(
            cls,
            f"HTTP {response.status}",
            status=response.status,
            retry_after=retry_after_seconds(response),
        )
        return self._handle(request, failure) or response

    def process_exception(self, request: Request, exception: Exception) -> Request | None:
        if request.meta.get("dont_retry"):
            return None
        cls = self.config.classify_exception(exception)
        if cls is None:
            return None
        return self._handle(request, Failure(cls, global_object_name(type(exception))))

    def _handle(self, request: Request, failure: Failure) -> Request | None:
        from scrapy_ha.scheduler import scheduler_for

        scheduler = scheduler_for(self.crawler)
        worker, now_ms = _who_and_when(self.crawler)
        verdict = decide(request, failure, self.config, worker=worker, now_ms=now_ms)
        if verdict["op"] == "dead":
            self.stats.inc_value(f"ha/retry/gave_up/{failure.cls}")
            return None
        self.stats.inc_value("ha/retry/count")
        self.stats.inc_value(f"ha/retry/{failure.cls}")
        if failure.cls == "rate_limited" and scheduler is not None:
            scheduler.close_gate(request, verdict["delay"])
        logger.debug(
            "Retrying %s in %.1f s (%s, %s)", request, verdict["delay"], failure.cls, failure.reason
        )
        return request.replace(dont_filter=True)


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
        if not crawler.settings.getbool("HA_RETRY_ENABLED", True):
            raise NotConfigured  # switched off: silent, as Scrapy's own RetryMiddleware
        return cls(crawler, RetryConfig.from_settings(crawler.settings))

    async def process_spider_output(
        self, response: Response, result: AsyncIterator[Any], spider: Spider | None = None
    ) -> AsyncIterator[Any]:
        """Pass the output on; note when the errback of a given-up request handled it."""
        async for x in result:
            yield x
        request = response.request
        verdict = request.meta.get(metakeys.OUTCOME) if request is not None else None
        if (
            verdict
            and verdict.get("op") == "dead"
            and request is not None
            and request.errback is not None
            and response.status >= 300
        ):
            verdict["errback"] = True  # the spider's errback had its say: no ERROR for it

    def process_spider_exception(
        self, response: Response, exception: Exception, spider: Spider | None = None
    ) -> None:
        request = response.request
        if request is None or request.meta.get("dont_retry"):
            return
        if metakeys.OUTCOME in request.meta or isinstance(exception, _NOT_PARSE_ERRORS):
            return  # judged by RetryMiddleware already (an HTTP error), or not a parse error
        cls = "permanent" if isinstance(exception, self.config.permanent_exceptions) else "parse"
        self._judge(request, cls, exception)

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
        self._judge(request, "pipeline", exception)

    def _judge(self, request: Request, cls: str, exception: BaseException) -> None:
        worker, now_ms = _who_and_when(self.crawler)
        reason = f"{global_object_name(type(exception))}: {exception}"[:300]
        verdict = decide(request, Failure(cls, reason), self.config, worker=worker, now_ms=now_ms)
        if verdict["op"] == "retry":
            self.crawler.stats.inc_value("ha/retry/count")
            self.crawler.stats.inc_value(f"ha/retry/{cls}")
        else:
            self.crawler.stats.inc_value(f"ha/retry/gave_up/{cls}")


def _who_and_when(crawler: Crawler) -> tuple[str, int]:
    """This worker's id and the Redis server's clock (the local clock without scrapy-ha's
    scheduler). ``is None``: the scheduler has a length, and an empty one is falsy."""
    from scrapy_ha.scheduler import scheduler_for

    scheduler = scheduler_for(crawler)
    if scheduler is None:
        return "", int(time.time() * 1000)
    return scheduler.config.worker_id, scheduler.server_time_ms()


def _short(item: Any) -> str:
    return repr(item)[:200]


_NOT_PARSE_ERRORS = (HttpError, IgnoreRequest)


def _allowed_status(request: Request, response: Response, crawler: Crawler) -> bool:
    """True if the spider asked to handle this status itself (HttpErrorMiddleware's rules)."""
    meta = request.meta
    if meta.get("handle_httpstatus_all"):
        return True
    allowed = meta.get("handle_httpstatus_list")
    if allowed is None:
        allowed = getattr(crawler.spider, "handle_httpstatus_list", None) or []
        allowed = [*allowed, *crawler.settings.getlist("HTTPERROR_ALLOWED_CODES")]
    return response.status in [int(x) for x in allowed]


def _int(settings: BaseSettings, name: str, default: int) -> int:
    value = settings.get(name, default)
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = -1
    if number < 0 or str(number) != str(value).strip():
        raise ConfigError(f"{name}={value!r} must be a whole number of 0 or more")
    return number


def _float(settings: BaseSettings, name: str, default: float) -> float:
    value = settings.get(name, default)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}={value!r} is not a number") from None
    if number < 0:
        raise ConfigError(f"{name}={value!r} must be 0 or more")
    return number


def _policies(settings: BaseSettings, base: Policy) -> dict[str, Policy]:
    policies = {name: replace(base, **fields) for name, fields in CLASS_DEFAULTS.items()}
    overrides = settings.getdict("HA_RETRY_POLICIES")
    for name, fields in overrides.items():
        if name not in policies or not isinstance(fields, dict):
            raise ConfigError(
                f"HA_RETRY_POLICIES[{name!r}]={fields!r}: the classes are {', '.join(policies)} "
                f"and each takes a dict of times, base, multiplier, max"
            )
        try:
            policies[name] = replace(policies[name], **fields)
        except TypeError as exc:
            raise ConfigError(f"HA_RETRY_POLICIES[{name!r}]={fields!r}: {exc}") from None
    return policies


def _status_classes(settings: BaseSettings) -> dict[int, str | None]:
    classes: dict[int, str | None] = dict(DEFAULT_STATUS_CLASSES)
    for status, cls in settings.getdict("HA_RETRY_STATUS_CLASSES").items():
        if cls not in CLASS_DEFAULTS and cls is not None:
            raise ConfigError(
                f"HA_RETRY_STATUS_CLASSES[{status!r}]={cls!r} is not a failure class "
                f"({', '.join(CLASS_DEFAULTS)}, or None for a success)"
            )
        classes[int(status)] = cls
    return classes


def _load_all(settings: BaseSettings, name: str) -> tuple[type[BaseException], ...]:
    loaded = []
    for path in settings.getlist(name):
        try:
            loaded.append(load_object(path) if isinstance(path, str) else path)
        except (ImportError, AttributeError, ValueError, NameError) as exc:
            raise ConfigError(f"{name} names {path!r}, which cannot be imported: {exc}") from None
    return tuple(loaded)


def _optional_callable(settings: BaseSettings, name: str) -> Callable[[Response], bool] | None:
    path = settings.get(name)
    if not path:
        return None
    try:
        func = load_object(path) if isinstance(path, str) else path
    except (ImportError, AttributeError, ValueError, NameError) as exc:
        raise ConfigError(f"{name}={path!r} cannot be imported: {exc}") from None
    if not callable(func):
        raise ConfigError(f"{name}={path!r} is not callable")
    return func  # type: ignore[no-any-return]
