"""The retry settings, validated: each failure class's budget and backoff (:class:`Policy`),
which statuses and exceptions fall in which class, Retry-After's cap and the jitter."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from scrapy.settings import Settings

from scrapy_ha.config import validate as check
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.verdict import RETRY_CLASSES, FailureClass, PermanentError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Self

    from scrapy.http import Response
    from scrapy.settings import BaseSettings

__all__ = ["CLASS_DEFAULTS", "DEFAULT_STATUS_CLASSES", "Policy", "RetryConfig"]

#: Retries per failure class (HA_RETRY_TIMES): enough to ride out a restart or a bad minute.
DEFAULT_RETRY_TIMES = 5
#: First backoff in seconds (HA_RETRY_BACKOFF_BASE): 3 s, 6 s, 12 s ... as most crawlers do.
DEFAULT_BACKOFF_BASE = 3.0
#: Backoff growth per attempt (HA_RETRY_BACKOFF_MULTIPLIER): exponential.
DEFAULT_BACKOFF_MULTIPLIER = 2.0
#: Longest backoff in seconds (HA_RETRY_BACKOFF_MAX): two minutes, short next to a crawl.
DEFAULT_BACKOFF_MAX = 120.0


@dataclass(frozen=True)
class Policy:
    """Budget and backoff of one failure class: delay = base × multiplier^n, capped."""

    times: int = DEFAULT_RETRY_TIMES
    base: float = DEFAULT_BACKOFF_BASE
    multiplier: float = DEFAULT_BACKOFF_MULTIPLIER
    max: float = DEFAULT_BACKOFF_MAX

    def backoff(self, attempt: int, jitter: float, rand: Callable[[], float]) -> float:
        return self.ceiling(attempt) * (1 - jitter * rand())

    def ceiling(self, attempt: int) -> float:
        """base × multiplier^attempt, capped at max, for any attempt: a power too large for
        a float (2.0 ** 1100 raises OverflowError) is past the cap."""
        try:
            grown = self.base * self.multiplier**attempt
        except OverflowError:
            grown = math.inf if self.base else 0.0
        return min(self.max, grown)


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


#: Retry-After is honoured up to this many seconds (Crawlee caps its per-domain backoff too).
DEFAULT_RETRY_AFTER_MAX = 600.0
#: Fraction of the backoff that is random: 1.0 is "full jitter" (0 .. backoff).
DEFAULT_JITTER = 1.0
#: Scrapy's RETRY_TIMES default: the retries of its robots.txt fetch.
DEFAULT_ROBOTS_RETRIES = 2
#: Priority change per retry: Scrapy's RETRY_PRIORITY_ADJUST default (fresh work first).
DEFAULT_PRIORITY_ADJUST = -1


def _class_policies(base: Policy) -> dict[FailureClass, Policy]:
    return {name: replace(base, **fields) for name, fields in CLASS_DEFAULTS.items()}


@dataclass(frozen=True)
class RetryConfig:
    """The retry settings, validated. The proxy middleware classifies with them too, so
    they are read whether or not the retry middlewares are on (HA_RETRY_ENABLED)."""

    enabled: bool = True
    policies: dict[FailureClass, Policy] = field(default_factory=lambda: _class_policies(Policy()))
    status_classes: dict[int, FailureClass | None] = field(
        default_factory=lambda: dict(DEFAULT_STATUS_CLASSES)
    )
    network_exceptions: tuple[type[BaseException], ...] = ()
    permanent_exceptions: tuple[type[BaseException], ...] = (PermanentError,)
    ban_check: Callable[[Response], bool] | None = None
    retry_after_max: float = DEFAULT_RETRY_AFTER_MAX
    jitter: float = DEFAULT_JITTER
    priority_adjust: int = DEFAULT_PRIORITY_ADJUST
    #: HTTPERROR_ALLOWED_CODES: statuses every spider handles itself.
    allowed_codes: tuple[int, ...] = ()
    #: HTTPERROR_ALLOW_ALL: every spider handles every status itself (unless the request
    #: lists its own, as HttpErrorMiddleware decides).
    allow_all: bool = False
    #: Scrapy's RETRY_TIMES: the retries of Scrapy's robots.txt fetch, which is downloaded
    #: again at once (it never goes through Redis), as Scrapy's own middleware retries it.
    robots_retries: int = DEFAULT_ROBOTS_RETRIES

    @classmethod
    def switched_on(cls, settings: BaseSettings) -> bool:
        """HA_RETRY_ENABLED: checked before the rest, so that retry middlewares switched
        off do not fail on a value they never use (the proxy middleware reads the rest)."""
        return check.boolean(settings, "HA_RETRY_ENABLED", True)

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        base = _policy(settings, _SETTINGS, Policy())
        return cls(
            enabled=check.boolean(settings, "HA_RETRY_ENABLED", True),
            policies=_policies(settings, base),
            status_classes=_status_classes(settings),
            network_exceptions=check.imported_list(settings, "RETRY_EXCEPTIONS"),
            permanent_exceptions=(
                PermanentError,
                *check.imported_list(settings, "HA_RETRY_PERMANENT_EXCEPTIONS"),
            ),
            ban_check=check.optional_callable(settings, "HA_BAN_CHECK"),
            retry_after_max=check.non_negative(
                settings, "HA_RETRY_AFTER_MAX", DEFAULT_RETRY_AFTER_MAX, finite=True
            ),
            jitter=check.fraction(settings, "HA_RETRY_JITTER", DEFAULT_JITTER),
            priority_adjust=check.integer(
                settings, "RETRY_PRIORITY_ADJUST", DEFAULT_PRIORITY_ADJUST
            ),
            allowed_codes=check.statuses(settings, "HTTPERROR_ALLOWED_CODES"),
            allow_all=check.boolean(settings, "HTTPERROR_ALLOW_ALL", False, theirs=True),
            robots_retries=_retry_times(settings),
        )

    def classify_response(self, response: Response) -> FailureClass | None:
        """The failure class of a response, or None if it is a success."""
        if self.ban_check is not None and self.ban_check(response):
            return FailureClass.BANNED
        status = response.status
        if status in self.status_classes:
            return self.status_classes[status]
        if status == 503 and b"Retry-After" in response.headers:
            return FailureClass.RATE_LIMITED
        if status >= 500:
            return FailureClass.SERVER
        if status >= 400:
            return FailureClass.CLIENT
        return None

    def classify_exception(self, exception: BaseException) -> FailureClass | None:
        """The failure class of an exception, or None if it is not a failure to handle."""
        if isinstance(exception, self.permanent_exceptions):
            return FailureClass.PERMANENT
        if isinstance(exception, self.network_exceptions):
            return FailureClass.NETWORK
        return None


#: Each Policy field and the setting that gives its value for every class.
_SETTINGS = {
    "times": "HA_RETRY_TIMES",
    "base": "HA_RETRY_BACKOFF_BASE",
    "multiplier": "HA_RETRY_BACKOFF_MULTIPLIER",
    "max": "HA_RETRY_BACKOFF_MAX",
}


def _policy(settings: BaseSettings, names: Mapping[str, str], default: Policy) -> Policy:
    """*default* with each field of *names* read from *settings* under names[field] and
    checked as the HA_RETRY_* setting of that field is: times a whole number of 0 or more,
    the others finite numbers of 0 or more (the error names names[field] and the value)."""
    read: dict[str, Any] = {}
    if "times" in names:
        read["times"] = check.whole(settings, names["times"], default.times, minimum=0)
    for name in ("base", "multiplier", "max"):
        if name in names:
            value = check.non_negative(settings, names[name], getattr(default, name), finite=True)
            if name != "multiplier" and value > check.MOST_SECONDS:
                # (1e15 was taken: the log said a retry in 1e15 s, Redis's delayed set
                # took another, and the worker retried every 10 s)
                raise ConfigError(
                    f"{names[name]}={settings.get(names[name])!r} must be at most "
                    f"{check.MOST_SECONDS:g} seconds"
                )
            read[name] = value
    return replace(default, **read)


def _policies(settings: BaseSettings, base: Policy) -> dict[FailureClass, Policy]:
    policies = _class_policies(base)
    for name, fields in check.mapping(settings, "HA_RETRY_POLICIES").items():
        if name not in RETRY_CLASSES or not isinstance(fields, dict) or set(fields) - {*_SETTINGS}:
            raise ConfigError(
                f"HA_RETRY_POLICIES[{name!r}]={fields!r}: the classes are {', '.join(policies)} "
                f"and each takes a dict of times, base, multiplier, max"
            )
        names = {f: f"HA_RETRY_POLICIES[{name!r}][{f!r}]" for f in fields}
        given = Settings({names[f]: v for f, v in fields.items()}, priority="project")
        policies[FailureClass(name)] = _policy(given, names, policies[FailureClass(name)])
    return policies


def _retry_times(settings: BaseSettings) -> int:
    """Scrapy's RETRY_TIMES as Scrapy reads it (``getint``: ``3.0`` and ``"03"`` are 3), a
    whole number of 0 or more, else an error that names it (a bare ValueError before)."""
    try:
        times = settings.getint("RETRY_TIMES", DEFAULT_ROBOTS_RETRIES)
    except (TypeError, ValueError):
        times = -1
    if times < 0:
        value = settings.get("RETRY_TIMES")
        raise ConfigError(f"RETRY_TIMES={value!r} must be a whole number of 0 or more")
    return times


def _status_classes(settings: BaseSettings) -> dict[int, FailureClass | None]:
    classes: dict[int, FailureClass | None] = dict(DEFAULT_STATUS_CLASSES)
    for status, fclass in check.mapping(settings, "HA_RETRY_STATUS_CLASSES").items():
        if fclass not in RETRY_CLASSES and fclass is not None:
            raise ConfigError(
                f"HA_RETRY_STATUS_CLASSES[{status!r}]={fclass!r} is not a failure class "
                f"({', '.join(RETRY_CLASSES)}, or None for a success)"
            )
        text = str(status).strip()
        if not (text.isascii() and text.isdigit() and 100 <= int(text) <= 999):  # noqa: PLR2004
            raise ConfigError(
                f"HA_RETRY_STATUS_CLASSES[{status!r}]: not an HTTP status code (100 to 999)"
            )
        classes[int(status)] = None if fclass is None else FailureClass(fclass)
    return classes
