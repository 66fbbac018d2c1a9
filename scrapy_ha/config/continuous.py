"""The settings of continuous crawling: how long a seen URL stays seen
(``HA_DUPEFILTER_TTL``, with either dupefilter), and revisits (``HA_REVISIT``...)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_ha.config import validate as check
from scrapy_ha.config.freshness import expected_interval, posterior
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.metakeys import REVISIT

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Self

    from scrapy.settings import BaseSettings

__all__ = [
    "CONDITIONAL_HEADERS",
    "DEFAULT_DUPEFILTER_TTL",
    "FIRST_MULTIPLIER",
    "MAX_DUPEFILTER_TTL",
    "MIN_DUPEFILTER_TTL",
    "RevisitConfig",
    "RevisitState",
    "dupefilter_ttl",
    "interval_bucket",
]

#: A URL seen once is seen for the life of the crawl, as with Scrapy's and scrapy-redis's
#: dupefilters (0: no age).
DEFAULT_DUPEFILTER_TTL = 0.0
#: The shortest age: a second. The time slices of lua/lib/aged.lua last an eighth of it,
#: and the server's clock is read in milliseconds.
MIN_DUPEFILTER_TTL = 1.0
#: The longest age: 1e10 s, about 317 years, within what a time slice's start (milliseconds)
#: and a date shown can hold (``inf`` overflowed the slices' arithmetic at start). The
#: crawl's claim (``ha:{S}:filter``) names it, and a claim with a longer one is unreadable.
MAX_DUPEFILTER_TTL = 1e10


def dupefilter_ttl(settings: BaseSettings) -> float:
    """``HA_DUPEFILTER_TTL``: seconds after which a URL seen before may be crawled again
    when linked again (0: never)."""
    name, default = "HA_DUPEFILTER_TTL", DEFAULT_DUPEFILTER_TTL
    try:
        ttl = check.seconds(settings, name, default, zero=True, finite=True, most=math.inf)
    except ConfigError as exc:  # a negative number: told the range, as a number too large
        number = _finite(check.raw(settings, name, default))
        if number is None or number >= 0:
            raise exc from None
        ttl = number
    if ttl and not MIN_DUPEFILTER_TTL <= ttl <= MAX_DUPEFILTER_TTL:
        raise ConfigError(
            f"{name}={check.raw(settings, name, default)!r} must be 0 (seen for ever) or "
            f"{MIN_DUPEFILTER_TTL:g} to {MAX_DUPEFILTER_TTL:g} seconds (about 317 years)"
        )
    return ttl


def _finite(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


# -- revisits ----------------------------------------------------------------------------

#: The shortest adaptive interval: Nutch's min_interval, a minute (a page that changes at
#: every look is not looked at more often than this).
DEFAULT_REVISIT_MIN = 60.0
#: The longest adaptive interval: 30 days, Nutch's db.fetch.interval.default (the interval it
#: gives a page it knows nothing about): a page that never changes is still looked at monthly.
DEFAULT_REVISIT_MAX = 30 * 86400.0
#: The shortest interval any revisit setting or ``meta["ha_revisit"]`` may give: a second.
#: A shorter one hot-loops (the page back in the delayed set due before its lease ended),
#: and the times kept are whole milliseconds of the server's clock.
MIN_REVISIT_INTERVAL = 1.0
#: The longest: 1e10 s (some 317 years, "never" in practice), so that a revisit's due time
#: is one every tool can show (1e12 s was due in the year 33,715, shown as 9999-12-30: a QA
#: run). Longer ones (1.7e308) overflow the sums of adaptive revisits (a ZeroDivisionError
#: at every revisit's end).
MAX_REVISIT_INTERVAL = 1e10
#: ``HA_REVISIT_MAX_FAILURES``: failed visits in a row after which a revisited URL is
#: dead-lettered (5: each is a request's whole retry budget spent, or a 404, an interval
#: apart; a page down for a day at an hourly interval is still given up within hours).
DEFAULT_REVISIT_MAX_FAILURES = 5
#: ``HA_REVISIT_BUDGET``: 0, the visits a second the configured intervals would make (the sum
#: of ``1 / interval`` over the URLs revisited), so that adaptive revisits spend what fixed
#: ones of the same rules would, and a crawl switching to them keeps its bandwidth.
DEFAULT_REVISIT_BUDGET = 0.0
#: The crawl's first multiplier, times the configured interval: the marginal gain of a page
#: that changes once per configured interval, visited at it (``1 - 2/e``, 0.264); Redis
#: nudges it from there (lua/lib/revisit.lua).
FIRST_MULTIPLIER = 0.264
#: Upper bounds (seconds) of the interval histogram (stats ``revisit_iv:<bound>`` and the
#: metric ``scrapy_ha_revisit_interval_seconds``): a minute, 5 and 15 minutes, an hour, 6
#: hours, a day, a week; longer ones count under ``inf``.
INTERVAL_BUCKETS = (60, 300, 900, 3600, 21600, 86400, 604800)

#: What a revisit found (the middleware's verdict; ``unknown`` when no
#: ``scrapy_ha.revisit.RevisitMiddleware`` looked at the response; ``failed``: the visit
#: failed, its retries spent, and the URL goes on being revisited).
OUTCOMES = ("new", "changed", "unchanged", "not_modified", "unknown", "failed")
#: The validators a revisit sends (``scrapy_ha.revisit.RevisitMiddleware``): those of the
#: URL's last full answer and no others (a visit before left its own in the stored request:
#: a site that stopped sending ``ETag`` or ``Last-Modified`` was asked with them for ever);
#: a redirect of a revisit copies them, and they are dropped there.
CONDITIONAL_HEADERS = (b"If-None-Match", b"If-Modified-Since")


@dataclass(frozen=True)
class RevisitState:
    """What is kept of a revisited URL between two visits, in its request's
    ``meta["ha_revisit_state"]`` (stored with it in Redis): the interval, the validators of
    the last full answer (``ETag``, ``Last-Modified``), the signature of its content, the
    size of its body (what a 304 saves), and visits and changes so far; for adaptive
    revisits, the change rate's evidence (:mod:`scrapy_ha.config.freshness`): the intervals
    after which the page was found changed (``changed``, and the seconds they spanned,
    ``changed_for``), the seconds spanned by those after which it was not
    (``unchanged_for``; with the seconds a changed page had been unchanged when answered,
    its age), the changes whose time its ``Last-Modified`` told (``dated``), and when the
    last visit ended (``last``: the Redis server's clock as the worker estimates it,
    seconds since the epoch). ``age`` is the answer's, not stored: ``Date`` less
    ``Last-Modified`` (-1: not known). ``undated``:
    the page's ``Last-Modified`` is its ``Date`` whether it changed or not (found on an
    unchanged page): it is ignored from then on, and the body's signature alone tells.
    ``failures``: the visits that failed since the last that did not
    (``HA_REVISIT_MAX_FAILURES``)."""

    interval: float = 0.0
    etag: str = ""
    modified: str = ""
    signature: str = ""
    size: int = 0
    visits: int = 0
    changes: int = 0
    changed: int = 0
    changed_for: float = 0.0
    unchanged_for: float = 0.0
    last: float = 0.0
    dated: int = 0
    age: float = -1.0
    undated: bool = False
    failures: int = 0

    @classmethod
    def from_meta(cls, value: Any) -> RevisitState:
        """The state a request carries (a fresh one for anything unreadable, such as a
        number that is not finite: ``"i": "nan"`` would make every sum it enters NaN)."""
        if not isinstance(value, dict):
            return cls()
        try:
            state = cls(
                float(value.get("i", 0)),
                str(value.get("e", "")),
                str(value.get("m", "")),
                str(value.get("h", "")),
                int(value.get("b", 0)),
                int(value.get("n", 0)),
                int(value.get("c", 0)),
                int(value.get("x", 0)),
                float(value.get("s", 0)),
                float(value.get("u", 0)),
                float(value.get("t", 0)),
                int(value.get("y", 0)),
                undated=bool(value.get("z", 0)),
                failures=int(value.get("f", 0)),
            )
        except (TypeError, ValueError, OverflowError):
            return cls()
        numbers = (state.interval, state.changed_for, state.unchanged_for, state.last)
        return state if all(math.isfinite(x) for x in numbers) else cls()

    def as_meta(self) -> dict[str, Any]:
        """As stored: short keys, empty fields left out (every byte is kept per URL)."""
        doc: dict[str, Any] = {"i": round(self.interval, 3), "n": self.visits, "c": self.changes}
        for key, value in (("e", self.etag), ("m", self.modified), ("h", self.signature)):
            if value:
                doc[key] = value
        if self.size:
            doc["b"] = self.size
        if self.last:
            doc.update(x=self.changed, s=round(self.changed_for, 3))
            doc.update(u=round(self.unchanged_for, 3), t=round(self.last, 3))
        if self.dated:
            doc["y"] = self.dated
        if self.undated:
            doc["z"] = 1
        if self.failures:
            doc["f"] = self.failures
        return doc


@dataclass(frozen=True)
class RevisitConfig:
    """``HA_REVISIT``, ``HA_REVISIT_ADAPTIVE``, ``HA_REVISIT_MIN``/``MAX``,
    ``HA_REVISIT_SIGNATURE``, ``HA_REVISIT_BUDGET`` and ``HA_REVISIT_MAX_FAILURES``."""

    #: (compiled URL regex, seconds) in the setting's order: the first that matches wins
    rules: tuple[tuple[re.Pattern[str], float], ...] = ()
    adaptive: bool = False
    minimum: float = DEFAULT_REVISIT_MIN
    maximum: float = DEFAULT_REVISIT_MAX
    #: ``f(response) -> str | bytes``: what the content of a page is (None: its body)
    signature: Callable[..., Any] | None = None
    #: visits a second adaptive revisits spend, all workers together (0: what the
    #: configured intervals would)
    budget: float = DEFAULT_REVISIT_BUDGET
    #: failed visits in a row after which a revisited URL is dead-lettered
    max_failures: int = DEFAULT_REVISIT_MAX_FAILURES

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        rules = []
        for pattern, seconds in check.mapping(settings, "HA_REVISIT").items():
            try:
                compiled = re.compile(str(pattern))
            except re.error as exc:
                msg = f"HA_REVISIT[{pattern!r}] is not a regular expression: {exc}"
                raise ConfigError(msg) from None
            rules.append((compiled, _interval(f"HA_REVISIT[{pattern!r}]", seconds)))
        config = cls(
            rules=tuple(rules),
            adaptive=check.boolean(settings, "HA_REVISIT_ADAPTIVE", False),
            minimum=_bound(settings, "HA_REVISIT_MIN", DEFAULT_REVISIT_MIN),
            maximum=_bound(settings, "HA_REVISIT_MAX", DEFAULT_REVISIT_MAX),
            signature=check.optional_callable(settings, "HA_REVISIT_SIGNATURE"),
            budget=check.non_negative(
                settings, "HA_REVISIT_BUDGET", DEFAULT_REVISIT_BUDGET, finite=True
            ),
            max_failures=check.whole(
                settings, "HA_REVISIT_MAX_FAILURES", DEFAULT_REVISIT_MAX_FAILURES
            ),
        )
        if config.minimum > config.maximum:
            raise ConfigError(
                f"HA_REVISIT_MIN={config.minimum:g} must not be longer than "
                f"HA_REVISIT_MAX={config.maximum:g}"
            )
        return config

    def interval_for(self, url: str, meta: Mapping[str, Any]) -> float | None:
        """Seconds between two visits of a request with this *url* and *meta*: its
        ``meta["ha_revisit"]``, else the first ``HA_REVISIT`` rule that matches the URL;
        None: it is not revisited (``ha_revisit`` 0, False or None stops it). A bad meta
        value raises :class:`ConfigError` naming it."""
        if REVISIT in meta:
            value = meta[REVISIT]
            return None if not value else _interval(f"meta[{REVISIT!r}]", value)
        for pattern, seconds in self.rules:
            if pattern.search(url):
                return seconds
        return None

    def next_interval(self, base: float, evidence: RevisitState, multiplier: float) -> float:
        """The interval until the next visit: *base* (the configured one) with fixed
        revisits; adaptive, the one where a visit a second more gains the crawl's
        *multiplier* in freshness, expected over what *evidence* says of the page's change
        rate, within ``HA_REVISIT_MIN``/``MAX`` (:mod:`scrapy_ha.config.freshness`)."""
        if not self.adaptive:
            return base
        post = posterior(
            evidence.changed,
            evidence.changed_for,
            evidence.unchanged_for,
            self.minimum,
            self.maximum,
            evidence.dated,
        )
        return expected_interval(post, multiplier, self.minimum, self.maximum)


def interval_bucket(seconds: float) -> str:
    """The histogram bucket of an interval: the smallest bound it is not over, or ``inf``."""
    return next((str(b) for b in INTERVAL_BUCKETS if seconds <= b), "inf")


def _interval(name: str, value: Any) -> float:
    """Seconds, finite and within :data:`MIN_REVISIT_INTERVAL` ..
    :data:`MAX_REVISIT_INTERVAL` (``inf`` would be a revisit never due, ``nan`` one whose
    every sum is NaN, 0.01 a page fetched in a loop)."""
    message = (
        f"{name}={value!r} must be seconds, a finite number from {MIN_REVISIT_INTERVAL:g} "
        f"to {MAX_REVISIT_INTERVAL:g}"
    )
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(message)
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not (MIN_REVISIT_INTERVAL <= seconds <= MAX_REVISIT_INTERVAL):  # (nan is neither)
        raise ConfigError(message)
    return seconds


def _bound(settings: BaseSettings, name: str, default: float) -> float:
    """``HA_REVISIT_MIN`` or ``MAX``: an interval (see :func:`_interval`)."""
    return _interval(name, check.number(settings, name, default, finite=True))
