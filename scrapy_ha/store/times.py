"""Times Redis holds (ms since the epoch: sorted-set scores, script replies) as whole
numbers every tool can show and compute with, whatever was written there by hand."""

from __future__ import annotations

__all__ = ["LATEST_MS", "time_ms"]

#: The latest time a tool shows: a score written by hand may be ``inf``.
LATEST_MS = 253_402_214_399_000  # 9999-12-30 23:59:59 UTC: a local time east of UTC is in 9999 too


def time_ms(score: float | bytes | str) -> int:
    """A time Redis holds (ms; a sorted set's score, a script's reply) as a whole number
    every tool can show: ``inf`` or a time past 9999 (written by hand) is that year's end,
    ``-inf`` the epoch."""
    try:
        value = float(score)
    except OverflowError:  # a whole number of 400 digits
        return LATEST_MS if int(score) > 0 else 0
    return int(min(max(value, 0.0), LATEST_MS)) if value == value else 0
