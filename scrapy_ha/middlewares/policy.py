"""The retry policy: which failure class an attempt falls in, and the verdict on it.

Module-level functions with no Scrapy component around them: the middlewares in
:mod:`scrapy_ha.retry` and :mod:`scrapy_ha.proxy` call them, and tests call them directly.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

from scrapy_ha import metakeys
from scrapy_ha.codec import strip_credentials
from scrapy_ha.verdict import FailureClass, Verdict

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.http import Response

    from scrapy_ha.config.middlewares import RetryConfig

#: Attempts kept in a request's history (bounds its size in Redis).
HISTORY_LIMIT = 10
#: Retries per failure class (HA_RETRY_TIMES): enough to ride out a restart or a bad minute.
DEFAULT_RETRY_TIMES = 5
#: First backoff in seconds (HA_RETRY_BACKOFF_BASE): 3 s, 6 s, 12 s ... as most crawlers do.
DEFAULT_BACKOFF_BASE = 3.0
#: Backoff growth per attempt (HA_RETRY_BACKOFF_MULTIPLIER): exponential.
DEFAULT_BACKOFF_MULTIPLIER = 2.0
#: Longest backoff in seconds (HA_RETRY_BACKOFF_MAX): two minutes, short next to a crawl.
DEFAULT_BACKOFF_MAX = 120.0
#: Share of the Retry-After wait added at random (up to 10 % with full jitter): workers told
#: the same Retry-After do not all come back in the same second.
RETRY_AFTER_SPREAD = 0.1


class PermanentError(Exception):
    """Raise from a callback for a failure that no retry can fix: dead-lettered at once."""


@dataclass(frozen=True)
class Policy:
    """Budget and backoff of one failure class: delay = base × multiplier^n, capped."""

    times: int = DEFAULT_RETRY_TIMES
    base: float = DEFAULT_BACKOFF_BASE
    multiplier: float = DEFAULT_BACKOFF_MULTIPLIER
    max: float = DEFAULT_BACKOFF_MAX

    def backoff(self, attempt: int, jitter: float, rand: Callable[[], float]) -> float:
        cap = min(self.max, self.base * self.multiplier**attempt)
        return cap * (1 - jitter * rand())


#: How each class differs from the global policy (HA_RETRY_TIMES, HA_RETRY_BACKOFF_*).
CLASS_DEFAULTS: dict[FailureClass, dict[str, Any]] = {
    FailureClass.NETWORK: {"base": 1.0},  # a dropped connection is usually fine a second later
    FailureClass.SERVER: {},
    FailureClass.RATE_LIMITED: {},
    FailureClass.BANNED: {"times": 3},  # its own budget: a proxy rotation each time
    FailureClass.PARSE: {"times": 2, "base": 10.0},
    FailureClass.PIPELINE: {"base": 1.0},  # a database write that failed: retry soon
    FailureClass.GONE: {"times": 0},
    FailureClass.CLIENT: {"times": 0},
    FailureClass.PERMANENT: {"times": 0},
}

#: Statuses whose class is not what their hundred says (HA_RETRY_STATUS_CLASSES adds to it).
DEFAULT_STATUS_CLASSES: dict[int, FailureClass] = {
    403: FailureClass.BANNED,
    404: FailureClass.GONE,
    408: FailureClass.SERVER,
    410: FailureClass.GONE,
    429: FailureClass.RATE_LIMITED,
}


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


def classify_response(config: RetryConfig, response: Response) -> FailureClass | None:
    """The failure class of a response, or None if it is a success."""
    if config.ban_check is not None and config.ban_check(response):
        return FailureClass.BANNED
    status = response.status
    if status in config.status_classes:
        return config.status_classes[status]
    if status == 503 and b"Retry-After" in response.headers:
        return FailureClass.RATE_LIMITED
    if status >= 500:
        return FailureClass.SERVER
    if status >= 400:
        return FailureClass.CLIENT
    return None


def classify_exception(config: RetryConfig, exception: BaseException) -> FailureClass | None:
    """The failure class of an exception, or None if it is not a failure to handle."""
    if isinstance(exception, config.permanent_exceptions):
        return FailureClass.PERMANENT
    if isinstance(exception, config.network_exceptions):
        return FailureClass.NETWORK
    return None


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
    budget = meta.get(metakeys.RETRY_TIMES, policy.times)
    retries[fclass.value] = attempt + 1
    meta[metakeys.RETRIES] = retries
    meta[metakeys.HISTORY] = _history(meta, failure, worker, now_ms)
    verdict: Verdict
    if attempt >= budget:
        verdict = Verdict.dead(fclass, failure.reason, status=failure.status, attempts=attempt + 1)
    else:
        delay = _delay(failure, policy, attempt, config, rand)
        verdict = Verdict.retry(fclass, failure.reason, delay, status=failure.status)
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


def _delay(
    failure: Failure, policy: Policy, attempt: int, config: RetryConfig, rand: Callable[[], float]
) -> float:
    if failure.retry_after is not None:
        spread = 1 + RETRY_AFTER_SPREAD * config.jitter * rand()
        return min(failure.retry_after, config.retry_after_max) * spread
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
