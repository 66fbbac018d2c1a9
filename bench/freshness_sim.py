"""A simulation of ``bench/freshness.py compare`` (seconds, not minutes), and the ceiling any
revisit policy can reach on its site.

``python bench/freshness_sim.py ceiling --compress 288 --rate 20,10,5`` computes, for the
site's rates (seeds 1 to 3: the benchmark's 1,000 pages, log-uniform from once a minute to
once a day, time compressed ``--compress`` times), the freshness of a fixed interval
(``pages / rate``) and of Cho and Garcia-Molina's optimum with the rates known: the
intervals where every page gains the same from one more visit a second (the Lagrange
optimum of ``sum (f / l)(1 - exp(-l / f))`` at ``sum f = rate``), solved here by its own
bisection, without the bounds and within ``HA_REVISIT_MIN``/``MAX`` (1/8 and 16 times the
fixed interval, as the benchmark's).

``python bench/freshness_sim.py run --compress 1152 --seconds 360 --warmup 180`` plays the
benchmark's crawl: one fetch every ``1 / rate`` seconds, the most overdue page first; fixed
intervals, or adaptive ones from this tree's estimator and allocation
(``scrapy_ha.config.freshness``: the posterior, the expected interval; the multiplier's rule
of ``lua/lib/revisit.lua``), with the evidence a visit gives (``--estimator lm``: a changed
page's age from its ``Last-Modified`` and ``Date``, whole seconds, as
``scrapy_ha.scheduler.revisits`` counts it; ``intervals``: the intervals alone, as without a
``Last-Modified``; ``oracle``: the true rates). Freshness is integrated exactly over
``[warmup, seconds]``. It prints the ratio adaptive / fixed per seed.
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from scrapy_ha.config.continuous import FIRST_MULTIPLIER  # noqa: E402
from scrapy_ha.config.freshness import (  # noqa: E402
    expected_interval,
    freshness,
    optimal_interval,
    posterior,
)

PAGES = 1000
#: lua/lib/revisit.lua's ALLOC_GAIN and ALLOC_STEP
ALLOC_GAIN, ALLOC_STEP = 0.5, 0.1


def site_rates(seed: int, compress: float) -> tuple[random.Random, list[float]]:
    """The benchmark site's rates (changes per real second), drawn as freshness_site.py
    draws them, and the generator that goes on to draw their changes."""
    rng = random.Random(seed)
    low, high = math.log(1 / 86400), math.log(1 / 60)
    return rng, [math.exp(rng.uniform(low, high)) * compress for _ in range(PAGES)]


def _interval(rate: float, mu: float, low: float, high: float) -> float:
    """``(1 - (1 + x) exp(-x)) / rate = mu`` for ``x = rate * I``, by bisection: its own,
    not the package's, so that the ceiling checks it."""
    if rate * mu >= 1:
        return high
    lo, hi = 0.0, 60.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if 1 - (1 + mid) * math.exp(-mid) < rate * mu:
            lo = mid
        else:
            hi = mid
    return min(high, max(low, (lo + hi) / 2 / rate))


def optimum(rates: list[float], budget: float, low: float, high: float) -> tuple[float, float]:
    """(mean freshness, multiplier) of the optimal allocation of *budget* visits a second."""
    a, b = 1e-4, 1e4
    for _ in range(100):
        mu = math.sqrt(a * b)
        load = sum(1 / _interval(r, mu, low, high) for r in rates)
        a, b = (mu, b) if load > budget else (a, mu)
    mean = sum(freshness(r, _interval(r, mu, low, high)) for r in rates) / len(rates)
    return mean, mu


def ceiling(args: argparse.Namespace) -> None:
    for rate in args.rate:
        for seed in args.seeds:
            _, rates = site_rates(seed, args.compress)
            base = PAGES / rate
            fixed = sum(freshness(r, base) for r in rates) / PAGES
            free, mu = optimum(rates, rate, 1e-6, 1e9)
            bounded, _ = optimum(rates, rate, base / 8, base * 16)
            print(
                f"compress {args.compress:g} rate {rate:g} seed {seed}: fixed {fixed:.4f}, "
                f"optimum {free:.4f} ({free / fixed:.3f}x, multiplier {mu:.2f} s), "
                f"within the bounds {bounded:.4f} ({bounded / fixed:.3f}x)"
            )


def count(
    evidence: list[float], estimator: str, changed: bool, spanned: float | None, age: float
) -> list[float]:
    """A visit's evidence added as scrapy_ha.scheduler.revisits counts it (dated changes,
    changed intervals, their seconds, unchanged seconds); *spanned* is None at the first
    visit, *age* its Date less its Last-Modified (ignored but by the ``lm`` estimator)."""
    dated, n_changed, changed_for, unchanged = evidence
    if estimator == "lm" and spanned is None:
        unchanged += age
    elif estimator == "lm" and changed and spanned is not None and age <= spanned + 1:
        dated, unchanged = dated + 1, unchanged + min(age, spanned)
    elif changed and spanned is not None:
        n_changed, changed_for = n_changed + 1, changed_for + spanned
    elif spanned is not None:
        unchanged += spanned
    return [dated, n_changed, changed_for, unchanged]


def crawl(policy: str, seed: int, args: argparse.Namespace) -> tuple[float, float, float]:
    """(freshness over the window, the multiplier, the load at the end) of one run."""
    rng, rates = site_rates(seed, args.compress)
    end = args.seconds
    changes = []
    for rate in rates:
        t, times = rng.expovariate(rate), []
        while t < end + 10:
            times.append(t)
            t += rng.expovariate(rate)
        changes.append(times)
    offset = rng.random()  # where the site's start falls within its second
    base = PAGES / args.rate
    low, high = base / 8, base * 16
    copy: list[int | None] = [None] * PAGES
    last = [0.0] * PAGES
    stale = [0.0] * PAGES
    interval = [base] * PAGES
    evidence: list[list[float]] = [[0, 0, 0.0, 0.0] for _ in range(PAGES)]
    due = [(i / args.rate, i) for i in range(PAGES)]
    mu, load, seen, fresh, free_at = FIRST_MULTIPLIER * base, 0.0, 0, 0.0, 0.0

    def credit(i: int, until: float) -> float:
        if copy[i] is None:
            return 0.0
        a, b = max(last[i], args.warmup), min(until, stale[i], end)
        return max(0.0, b - a)

    while True:
        at, i = heapq.heappop(due)
        t = max(free_at, at)
        free_at = t + 1 / args.rate
        if t >= end:
            break
        version = bisect.bisect_right(changes[i], t)
        fresh += credit(i, t)
        first, changed = copy[i] is None, copy[i] is not None and version != copy[i]
        if policy == "fixed":
            nxt = base
        else:
            modified = changes[i][version - 1] if version else 0.0
            age = math.floor(t + offset) - math.floor(modified + offset)
            spanned = None if first else t - last[i]
            evidence[i] = count(evidence[i], args.estimator, changed, spanned, age)
            dated, n_changed, changed_for, unchanged = evidence[i]
            if args.estimator == "oracle":
                nxt = optimal_interval(rates[i], mu, low, high)
            else:
                post = posterior(n_changed, changed_for, unchanged, low, high, dated)
                nxt = expected_interval(post, mu, low, high)
            seen += first
            load += 1 / nxt - (0 if first else 1 / interval[i])
            step = (load / args.rate) ** (ALLOC_GAIN / max(seen, 1))
            mu *= min(1 + ALLOC_STEP, max(1 - ALLOC_STEP, step))
        interval[i] = nxt
        copy[i], last[i] = version, t
        stale[i] = changes[i][version] if version < len(changes[i]) else math.inf
        heapq.heappush(due, (t + nxt, i))
    fresh += sum(credit(i, end) for i in range(PAGES))
    return fresh / (PAGES * (end - args.warmup)), mu, load


def run(args: argparse.Namespace) -> None:
    for seed in args.seeds:
        fixed, _, _ = crawl("fixed", seed, args)
        adaptive, mu, load = crawl("adaptive", seed, args)
        print(
            f"compress {args.compress:g} rate {args.rate:g} {args.seconds:g} s "
            f"(from {args.warmup:g} s) {args.estimator} seed {seed}: fixed {fixed:.4f}, "
            f"adaptive {adaptive:.4f}, {adaptive / fixed:.3f}x (multiplier {mu:.2f} s, "
            f"load {load:.2f}/s)",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("ceiling", "run"))
    parser.add_argument("--compress", type=float, default=288.0)
    parser.add_argument("--rate", default="20", help="requests/s (ceiling: a list)")
    parser.add_argument("--seconds", type=float, default=480.0)
    parser.add_argument("--warmup", type=float, default=240.0)
    parser.add_argument("--estimator", choices=("lm", "intervals", "oracle"), default="lm")
    parser.add_argument("--seeds", default="1,2,3")
    args = parser.parse_args()
    args.seeds = [int(s) for s in args.seeds.split(",")]
    if args.mode == "ceiling":
        args.rate = [float(r) for r in args.rate.split(",")]
        ceiling(args)
    else:
        args.rate = float(args.rate)
        run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
