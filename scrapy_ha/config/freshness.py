"""The freshness-optimal revisit interval of a page (``HA_REVISIT_ADAPTIVE``): its change
rate estimated from its visits, and the interval that rate earns at the crawl's budget.

Freshness (Cho and Garcia-Molina, "Effective page refresh policies", 2003): a page that
changes as a Poisson process of rate *l*, visited every *I* seconds, is fresh for a fraction
``(1 - exp(-l I)) / (l I)`` of the time. At a fixed total visit rate (the budget: the sum of
every page's ``1 / I``), the sum of the pages' freshness is highest when every page gains
the same from one more visit a second, the crawl's *multiplier* ``mu``:
``(1 - (1 + x) exp(-x)) / l = mu`` with ``x = l I``. A page that changes slowly gets a long
interval, one that changes faster a shorter one, and one that changes faster than
``1 / mu`` (more often than the budget can follow) is given up: the longest interval, its
visits spent where they buy freshness. The multiplier is the crawl's, kept in Redis and
nudged at each revisit until the intervals' load matches the budget (lua/lib/revisit.lua).

The change rate (Cho and Garcia-Molina, "Estimating frequency of change", 2003): what the
visits of a page say of its rate is the likelihood of what they found, ``(1 - exp(-l I))``
for each interval after which it had changed, ``exp(-l I)`` for each after which it had
not. Kept per URL as three numbers (the changes, the seconds of the intervals that ended
in one, the seconds of those that did not), it is exact for the unchanged intervals and
takes the changed ones at their mean. Over a log-uniform prior from a tenth of the
slowest rate the bounds serve (``0.1 / HA_REVISIT_MAX``) to ten times the fastest
(``10 / HA_REVISIT_MIN``) it gives a posterior on a grid; its geometric mean is the
estimate (:func:`change_rate`, which agrees with their estimator
``-ln((n - X + 0.5) / (n + 0.5)) / I`` once the visits are many). The interval is the one
where the gain of a visit a second more, expected over the posterior, is the multiplier
(:func:`expected_interval`): a page seen a few times is neither given up nor chased on one
estimate, and a page never found changed has its interval grow visit by visit rather than
jump to the longest.
"""

from __future__ import annotations

import math
import sys

__all__ = [
    "change_rate",
    "cho_estimate",
    "freshness",
    "marginal_gain",
    "multiplier_range",
    "optimal_interval",
]

#: Points of the estimate's grid of rates (log-spaced): 48 over the prior's range (five
#: orders of magnitude for bounds a minute and 30 days apart) puts neighbours ~27% apart,
#: finer than what a few dozen visits can tell.
GRID_POINTS = 48
#: The prior's range around the rates the bounds serve: a tenth of ``1 / HA_REVISIT_MAX``
#: to ten times ``1 / HA_REVISIT_MIN``.
PRIOR_MARGIN = 10.0
#: Bisection steps for the interval: 2^-50 of the range, well under a millisecond.
BISECTIONS = 50
#: Where the search for ``x = l I`` stops: ``(1 + x) exp(-x)`` is ~1e-20 at 50.
X_MAX = 50.0


def freshness(rate: float, interval: float) -> float:
    """The time-averaged freshness of a page changing at *rate* (per second) visited every
    *interval* seconds."""
    x = rate * interval
    return 1.0 if x <= 0 else -math.expm1(-x) / x


def marginal_gain(x: float) -> float:
    """``1 - (1 + x) exp(-x)``: the freshness one more visit a second buys, times the
    page's rate, for ``x = rate * interval`` (0 at 0, rising to 1)."""
    return -math.expm1(-x) - x * math.exp(-x)


def optimal_interval(rate: float, multiplier: float, low: float, high: float) -> float:
    """The interval where a page of *rate* gains *multiplier* per visit a second (see the
    module), within *low* and *high*; *high* when the page changes faster than the budget
    can follow (``rate * multiplier >= 1``) or never changes."""
    target = rate * multiplier
    if rate <= 0 or target >= 1:
        return high
    lo, hi = 0.0, X_MAX
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        if marginal_gain(mid) < target:
            lo = mid
        else:
            hi = mid
    return min(high, max(low, (lo + hi) / 2 / rate))


def multiplier_range(low: float, high: float) -> tuple[float, float]:
    """The multipliers that move an interval within the bounds *low* and *high*
    (``HA_REVISIT_MIN``/``MAX``), whatever a page's visits say: at the highest, *high*,
    every page gets the longest interval (a visit a second more gains at most the interval,
    ``g(x) / l <= I``); at the lowest or less, every page gets the shortest (the least a
    rate of the prior's range gains at *low*: ``g(x) / x`` rises then falls, so over the
    range it is least at one end). Redis keeps the crawl's multiplier within them
    (lua/lib/revisit.lua): a budget the bounds cannot meet would push it further for as
    long as it lasts, moving no interval, and it would take as long to come back."""
    rates = (1 / (high * PRIOR_MARGIN), PRIOR_MARGIN / low)
    lowest = min(marginal_gain(rate * low) / rate for rate in rates)
    # (bounds 1e16 or more apart make it 0.0 in floats, which Redis would refuse: the
    # least positive float moves no interval either)
    return max(lowest, sys.float_info.min), high


def cho_estimate(visits: int, changes: int, interval: float) -> float:
    """Cho and Garcia-Molina's estimator: ``-ln((n - X + 0.5) / (n + 0.5)) / I``."""
    return -math.log((visits - changes + 0.5) / (visits + 0.5)) / interval


def posterior(
    changes: float,
    changed_for: float,
    unchanged_for: float,
    low: float,
    high: float,
    dated: float = 0,
) -> list[tuple[float, float]]:
    """The change rate of a page found changed *changes* times over intervals totalling
    *changed_for* seconds, unchanged for *unchanged_for* seconds, and seen to change at a
    known time (its ``Last-Modified``) *dated* times: ``(rate, probability)`` on a
    log-spaced grid, the prior log-uniform around the bounds *low* and *high*
    (``HA_REVISIT_MIN``/``MAX``). The likelihood is exact for the unchanged seconds
    (``exp(-l U)``) and the dated changes (``l^Y``: a change at that time, none since, the
    seconds since counted in U), and takes the changes of unknown time at their intervals'
    mean (``(1 - exp(-l C / X))^X``)."""
    lo, hi = 1 / (high * PRIOR_MARGIN), PRIOR_MARGIN / low
    step = math.log(hi / lo) / (GRID_POINTS - 1)
    rates = [lo * math.exp(i * step) for i in range(GRID_POINTS)]
    mean = changed_for / changes if changes > 0 else 0.0
    logs = [dated * math.log(r) + _log_likelihood(r, changes, mean, unchanged_for) for r in rates]
    top = max(logs)
    weights = [math.exp(w - top) for w in logs]
    total = sum(weights)
    return [(r, w / total) for r, w in zip(rates, weights, strict=True)]


def change_rate(
    changes: float, changed_for: float, unchanged_for: float, low: float, high: float
) -> float:
    """The estimated changes per second: the posterior's geometric mean (see the module)."""
    post = posterior(changes, changed_for, unchanged_for, low, high)
    return math.exp(sum(p * math.log(r) for r, p in post))


def expected_interval(
    post: list[tuple[float, float]], multiplier: float, low: float, high: float
) -> float:
    """The interval where one more visit a second gains *multiplier* in expected freshness
    over the posterior *post* (``sum p g(r I) / r``, rising with I), within the bounds:
    *high* when even that gains less (the page changes too fast to be worth following)."""

    def gain(interval: float) -> float:
        return sum(p * marginal_gain(r * interval) / r for r, p in post)

    if gain(high) <= multiplier:
        return high
    lo, hi = math.log(low), math.log(high)
    if gain(low) >= multiplier:
        return low
    for _ in range(30):
        mid = (lo + hi) / 2
        if gain(math.exp(mid)) < multiplier:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2)


def _log_likelihood(rate: float, changes: float, mean: float, unchanged_for: float) -> float:
    changed = math.log(-math.expm1(-rate * mean)) if changes and mean > 0 else 0.0
    return changes * changed - rate * unchanged_for
