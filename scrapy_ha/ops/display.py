"""How the operator's tools show times (one format for the CLI and the dashboard), durations,
shares and lists of domains and classes, each name on one line."""

from __future__ import annotations

import time

from scrapy_ha.codec.log_masking import one_line
from scrapy_ha.store.times import LATEST_MS, time_ms

__all__ = [
    "LATEST_MS",
    "LINE_DOMAINS",
    "TIME_FORMAT",
    "humanize",
    "local_time",
    "most_domains",
    "one_line",
    "per_class",
    "share_text",
    "time_ms",
]

#: Domains a line names per reason its requests wait, the most waiting first: a 429 from
#: each of 220 hosts made a ``status`` line of thousands of characters (``--json`` has them all).
LINE_DOMAINS = 5

#: A local date-time as every tool prints it (and ``--since`` reads it first).
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


def local_time(ms: float | None) -> str:
    """A Redis time (ms since the epoch) as a local date-time, ``2026-11-30 17:05:12``;
    empty for none."""
    if not ms:
        return ""
    return time.strftime(TIME_FORMAT, time.localtime(time_ms(ms) / 1000))


def humanize(seconds: float) -> str:
    """A duration as people say it: ``45s``, ``3m 05s``, ``2h 10m``, ``3d 4h``."""
    s = int(abs(seconds))
    if s < 60:
        text = f"{s}s"
    elif s < 3600:
        text = f"{s // 60}m {s % 60:02d}s"
    elif s < 86400:
        text = f"{s // 3600}h {s % 3600 // 60:02d}m"
    else:
        text = f"{s // 86400}d {s % 86400 // 3600}h"
    return f"-{text}" if seconds < 0 else text


def share_text(share: float | None, space: str = "") -> str:
    """A share as a percentage with one decimal, ``61.7%``; ``n/a`` for none. A share
    short of the whole never reads 100 (2 dead of 30,000 retried read "100%"), nor one
    above nothing 0: ``>99.9%``, ``<0.1%``. *space* goes before the ``%``."""
    if share is None:
        return "n/a"
    if share <= 0 or share >= 1:
        text = "0%" if share <= 0 else "100%"
    else:
        text = f"{100 * share:.1f}%"
        if text == "100.0%":
            text = ">99.9%"
        elif text == "0.0%":
            text = "<0.1%"
    return text.replace("%", f"{space}%")


def per_class(title: str, total: int, by_class: dict[str, int]) -> str:
    """``      retried  12 (server 9, network 3)``: *total*, then each class's count, the
    most first, a class's name on one line (text from Redis: a line break in it made a line
    of its own)."""
    classes = ", ".join(f"{one_line(c)} {n:,}" for c, n in sorted(by_class.items(), key=_count))
    return f"{title:>13}  {total:,}" + (f" ({classes})" if classes else "")


def _count(item: tuple[str, int]) -> int:
    return -item[1]


def most_domains(counts: dict[str, int], most: int = LINE_DOMAINS) -> str:
    """``shop.example 36, api.example 4``: the *most* domains with the highest counts (then
    by name), and ``, and 104 more domains: 218`` for the others."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    named = ", ".join(f"{one_line(domain)} {n:,}" for domain, n in ranked[:most])
    if rest := ranked[most:]:
        named += f", and {len(rest):,} more domain{'' if len(rest) == 1 else 's'}: "
        named += f"{sum(n for _, n in rest):,}"
    return named
