"""The overview's rate chart: an inline SVG polyline drawn on the server (no script)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy_ha.ops.stats import CrawlStats

#: The chart's drawing box (SVG user units): wide and low, a sparkline.
WIDTH, HEIGHT = 240, 48
#: A minute in the server's milliseconds (the buckets' width).
MINUTE_MS = 60_000


@dataclass(frozen=True)
class Chart:
    """Pages per second for each of the last minutes, and the polyline that draws them."""

    per_second: list[float]
    points: str
    peak: float

    @property
    def last(self) -> float:
        return self.per_second[-1] if self.per_second else 0.0


def rate_chart(stats: CrawlStats, minutes: int, event: str = "acked") -> Chart:
    """*event* per second in each of the last *minutes* minutes, oldest first; the current
    minute counts over the seconds of it that passed (so a crawl that just began shows)."""
    buckets = stats.minutes.get(event, {})
    now_minute, into_ms = divmod(stats.now_ms, MINUTE_MS)
    values = [buckets.get(m, 0) / 60 for m in range(now_minute - minutes + 1, now_minute)]
    values.append(buckets.get(now_minute, 0) / max(into_ms / 1000, 1.0))
    peak = max(values, default=0.0)
    step = WIDTH / max(len(values) - 1, 1)
    scale = (HEIGHT - 2) / peak if peak else 0.0
    points = " ".join(f"{i * step:.1f},{HEIGHT - 1 - v * scale:.1f}" for i, v in enumerate(values))
    return Chart(values, points, peak)
