"""The retry policy applied: the verdict on a failed attempt (retry later, or dead), and the
attempt recorded in the request's history.

Module-level functions with no Scrapy component around them: the retry and proxy middlewares
call them, and tests call them directly. Which class a failure falls in is the settings'
call (:meth:`RetryConfig.classify_response <scrapy_ha.config.retry.RetryConfig>`).
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy_ha import metakeys
from scrapy_ha.codec import strip_credentials
from scrapy_ha.codec.masking import mask_text
from scrapy_ha.config.retry import Policy
from scrapy_ha.middlewares.proxy_sources import proxy_id
from scrapy_ha.verdict import DEAD, FailureClass, Verdict

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.http import Response

    from scrapy_ha.config.retry import RetryConfig

logger = logging.getLogger(__name__)

#: Attempts kept in a request's history (bounds its size in Redis).
HISTORY_LIMIT = 10
#: Share of the Retry-After wait added at random (up to 10 % with full jitter): workers told
#: the same Retry-After do not all come back in the same second.
RETRY_AFTER_SPREAD = 0.1
#: The classes no retry can fix (DESIGN: 404 and 410 gone, other 4xx, user-marked permanent
#: errors): meta ha_retry_times never gives them retries their policy does not.
PERMANENT_CLASSES = frozenset({FailureClass.GONE, FailureClass.CLIENT, FailureClass.PERMANENT})
#: The class of a request whose failure could not be judged (as the scheduler's own class of
#: a verdict it could not carry out, scrapy_ha.scheduler.session.ends).
ERROR_CLASS = "error"
#: Longest reason kept for an exception (its message can be huge).
REASON_LIMIT = 300


@dataclass(frozen=True)
class Failure:
    """One failed attempt, as the retry logic sees it."""

    failure_class: FailureClass
    reason: str
    status: int | None = None
    retry_after: float | None = None

    def __post_init__(self) -> None:
        # a class given by its stored name ("server") is the same class
        object.__setattr__(self, "failure_class", FailureClass(self.failure_class))
        # the reason is stored (history, verdict, dead letter) and shown: never a secret in
        # it (an exception's message may hold the request's URL with its API key)
        object.__setattr__(self, "reason", mask_text(self.reason))


def decide(
    request: Request,
    failure: Failure,
    config: RetryConfig,
    *,
    worker: str,
    now_ms: int,
    rand: Callable[[], float] = random.random,
) -> Verdict:
    """Record the attempt in *request*'s meta and set its verdict (``ha_outcome``).

    A retry changes ``request.priority`` by ``RETRY_PRIORITY_ADJUST`` (default -1), as
    Scrapy's own retries do, so that fresh work goes ahead of failures.

    Returns the verdict: a retry after a delay while the class's budget lasts, else dead.
    """
    meta = request.meta
    fclass = failure.failure_class
    retries: dict[str, int] = dict(meta.get(metakeys.RETRIES) or {})
    attempt = retries.get(fclass, 0)
    policy = config.policies.get(fclass, Policy(times=0))
    budget = _budget(meta, policy, fclass)
    retries[fclass.value] = attempt + 1
    meta[metakeys.RETRIES] = retries
    meta[metakeys.HISTORY] = _history(meta, failure, worker, now_ms)
    verdict: Verdict
    if attempt >= budget:
        verdict = Verdict.dead(fclass, failure.reason, status=failure.status, attempts=attempt + 1)
    else:
        delay = _delay(failure, policy, attempt, config, rand)
        verdict = Verdict.retry(fclass, failure.reason, delay, status=failure.status)
        meta.setdefault(metakeys.RETRY_BASE_PRIORITY, request.priority)
        request.priority += config.priority_adjust
    meta[metakeys.OUTCOME] = verdict
    return verdict


def _history(
    meta: dict[str, Any], failure: Failure, worker: str, now_ms: int
) -> list[dict[str, Any]]:
    """The request's attempts so far and this one, the oldest dropped past the limit."""
    history = list(meta.get(metakeys.HISTORY) or [])[-(HISTORY_LIMIT - 1) :]
    proxy = meta.get("proxy")
    history.append(
        {
            "t": now_ms,
            "class": failure.failure_class.value,
            "outcome": failure.reason,
            "worker": worker,
            "proxy": strip_credentials(proxy) if proxy else None,
        }
    )
    return history


def _budget(meta: dict[str, Any], policy: Policy, fclass: FailureClass) -> int:
    """The retries the request may make in its class: ``ha_retry_times`` when it is a whole
    number of 0 or more (else a WARNING and the class's budget). In the classes that are
    permanent by nature (gone, client, permanent) it can lower the budget, never raise it:
    a permanent failure stays permanent, as :class:`~scrapy_ha.verdict.PermanentError`
    promises."""
    given = meta.get(metakeys.RETRY_TIMES)
    if given is None:
        return policy.times
    if not isinstance(given, int) or isinstance(given, bool) or given < 0:
        logger.warning(
            "meta[%r]=%r is not a whole number of 0 or more: the class's budget (%d) applies",
            metakeys.RETRY_TIMES,
            given,
            policy.times,
        )
        return policy.times
    return min(given, policy.times) if fclass in PERMANENT_CLASSES else given


def _delay(
    failure: Failure, policy: Policy, attempt: int, config: RetryConfig, rand: Callable[[], float]
) -> float:
    if failure.retry_after is not None:
        spread = 1 + RETRY_AFTER_SPREAD * config.jitter * rand()
        return min(failure.retry_after, config.retry_after_max) * spread
    return policy.backoff(attempt, config.jitter, rand)


def retry_after_seconds(response: Response, now: float | None = None) -> float | None:
    """Retry-After in seconds (a number, or an HTTP date relative to the response's Date;
    without a readable Date, to *now*: the crawl's clock, Redis's, in seconds since the
    epoch, which the retry middleware passes, so that a worker whose own clock is off does
    not close the domain for minutes, or not at all; None: this machine's clock)."""
    value = response.headers.get(b"Retry-After")
    if not value:
        return None
    text = value.decode("latin-1").strip()
    if text.isascii() and text.isdigit():  # not "¹" (b"\xb9"), which str.isdigit() accepts
        return float(text)  # a huge number is inf: capped by HA_RETRY_AFTER_MAX
    try:
        when = parsedate_to_datetime(text).timestamp()
    except _UNREADABLE:
        return None
    date = response.headers.get(b"Date")
    clock = time.time() if now is None else now
    try:
        sent = parsedate_to_datetime(date.decode("latin-1")).timestamp() if date else clock
    except _UNREADABLE:
        sent = clock
    return max(0.0, when - sent)


def error_verdict(request: Request, error: Exception) -> Verdict:
    """Set and return the verdict on a request whose failure could not be judged (an
    unexpected exception in the retry policy's handling): dead, class ``error``, with the
    exception as its reason. Never an ack: the request reaches the dead-letter queue, where
    it can be requeued once the cause is fixed."""
    try:
        text = str(error)
    except Exception:  # noqa: BLE001 - an exception whose text raises: its type says enough
        text = "(its text could not be read)"
    reason = mask_text(f"could not judge the failure: {type(error).__name__}: {text}")
    verdict = Verdict(DEAD, ERROR_CLASS, reason[:REASON_LIMIT])
    request.meta[metakeys.OUTCOME] = verdict
    return verdict


#: What reading an HTTP date can raise on garbage (a year past 9999, an out-of-range time).
_UNREADABLE = (TypeError, ValueError, OverflowError, OSError, IndexError)


def through_proxy(request: Request) -> str:
    """`` (through proxy HOST:PORT)`` for a request sent through a proxy, else nothing: its
    refused, reset or timed-out connection is the proxy's, which a reason naming the error
    alone blamed on the site (a QA run: a tunnel down, every page dead-lettered as the
    site's ``DownloadConnectionRefusedError``). Never the proxy's credentials."""
    proxy = str(request.meta.get("proxy") or "")
    try:
        return f" (through proxy {proxy_id(proxy)})" if urlsplit(proxy).hostname else ""
    except ValueError:  # (a port that is no number: the proxy middleware names it)
        return ""
