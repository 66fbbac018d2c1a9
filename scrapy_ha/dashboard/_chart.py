"""The dashboard's time-series charts: inline SVG drawn on the server (no script, no build
step), with a time axis in local time, a value axis with its unit, and each bin's value on
hover. They read the crawl-wide per-minute buckets (``stats:min``, kept a day): pages per
second, and retries and dead letters per minute by failure class, over the last hour (a bin
a minute) or the last day (a bin per 10 minutes)."""

from __future__ import annotations

__all__ = ["WINDOWS", "Chart", "Series", "Window", "class_chart", "fit", "rate_chart", "speed"]

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from markupsafe import Markup, escape

from scrapy_ha.ops.labels import class_label
from scrapy_ha.ops.waiting import acks_since

if TYPE_CHECKING:
    from scrapy_ha.ops.stats import CrawlStats

#: A minute in the server's milliseconds (the buckets' width).
MINUTE_MS = 60_000
#: The drawing box of a chart (SVG user units) and the room its axes' labels take.
WIDTH, HEIGHT = 440, 160
LEFT, RIGHT, TOP, BOTTOM = 40, 8, 16, 20
#: The plot inside the axes: its width, its height, and the y of its base line.
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
BASE = TOP + PLOT_H
#: Series shown by name in a chart by class; the rest are summed as "other classes".
MOST_SERIES = 6


@dataclass(frozen=True)
class Window:
    """What a chart spans: *bins* bins of *bin_minutes* minutes, ending now; a time label
    every *tick_minutes* minutes (on the local clock's round times)."""

    name: str
    title: str
    bins: int
    bin_minutes: int
    tick_minutes: int


#: The windows a chart can show (``?window=``): the last hour, the last day.
WINDOWS = {
    "hour": Window("hour", "last hour", 60, 1, 15),
    "day": Window("day", "last day", 144, 10, 240),
}
#: The fewest minutes the hour chart spans for a crawl younger than an hour: it spans the
#: crawl's life, so that a crawl of one minute is not a spike at the edge of an hour.
FIT_MINUTES = 15


def fit(window: Window, stats: CrawlStats) -> Window:
    """*window*, or for the hour chart of a crawl that began less than an hour ago, the
    minutes since it began (at least :data:`FIT_MINUTES`, a label every 5 minutes)."""
    if window.bin_minutes != 1:
        return window
    first = min(
        (m for name in ("enqueued", "acked") for m in stats.minutes.get(name, {})), default=None
    )
    if first is None:
        return window
    minutes = max(FIT_MINUTES, stats.now_ms // MINUTE_MS - first + 2)
    if minutes >= window.bins:
        return window
    return Window(window.name, f"last {minutes} minutes", minutes, 1, 5)


@dataclass(frozen=True)
class Series:
    """One line or one layer of bars: its label, what it means, its value in each bin."""

    label: str
    meaning: str
    values: list[float]


@dataclass(frozen=True)
class Chart:
    """A chart of *series* over *window*, its values in *unit*; ``bars`` stacks them."""

    title: str
    unit: str
    window: Window
    #: the start of the first bin (server ms, a whole minute)
    start_ms: int
    series: list[Series]
    bars: bool = False

    @property
    def peak(self) -> float:
        totals = [sum(s.values[i] for s in self.series) for i in range(self.window.bins)]
        return max(totals, default=0.0)

    @property
    def last(self) -> float:
        """The newest bin's value (of the first series)."""
        return self.series[0].values[-1] if self.series and self.series[0].values else 0.0

    def svg(self) -> Markup:
        """The chart as inline SVG: axes, gridlines, the data, a title per bin for hover."""
        top = nice_top(self.peak)
        label = f"{self.title}, {self.window.title}, in {self.unit}: peak {number(self.peak)}"
        parts = [
            f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
            f'aria-label="{escape(label)}">',
            *self._value_axis(top),
            *self._time_axis(),
            *(self._bars(top) if self.bars else self._line(top)),
        ]
        if not self.peak:
            parts.append(
                f'<text class="nothing" x="{LEFT + PLOT_W / 2:.0f}" y="{BASE / 2:.0f}"'
                f' text-anchor="middle">nothing in the {escape(self.window.title)}</text>'
            )
        parts.append("</svg>")
        return Markup("".join(parts))

    def _x(self, i: float) -> float:
        return LEFT + PLOT_W * i / self.window.bins

    def _value_axis(self, top: float) -> list[str]:
        out = []
        for k in range(5):
            value = top * k / 4
            y = BASE * (1 - k / 4)
            out.append(
                f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
            )
            out.append(
                f'<text class="tick" x="{LEFT - 4}" y="{y + 3:.1f}" text-anchor="end">'
                f"{number(value)}</text>"
            )
        out.append(f'<text class="unit" x="{LEFT}" y="{TOP - 5}">{escape(self.unit)}</text>')
        return out

    def _time_axis(self) -> list[str]:
        w = self.window
        out = [f'<line class="axis" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{BASE}" y2="{BASE}"/>']
        span_ms = w.bins * w.bin_minutes * MINUTE_MS
        tick_ms = w.tick_minutes * MINUTE_MS
        offset = time.localtime(self.start_ms / 1000).tm_gmtoff * 1000
        first = math.ceil((self.start_ms + offset) / tick_ms) * tick_ms - offset
        for at in range(first, self.start_ms + span_ms + 1, tick_ms):
            x = LEFT + PLOT_W * (at - self.start_ms) / span_ms
            out.append(
                f'<line class="tickmark" x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{BASE + 3}"/>'
            )
            out.append(
                f'<text class="tick" x="{x:.1f}" y="{HEIGHT - 6}" text-anchor="middle">'
                f"{clock(at)}</text>"
            )
        return out

    def _bin_title(self, i: int, texts: list[str]) -> str:
        w = self.window
        at = self.start_ms + i * w.bin_minutes * MINUTE_MS
        when = (
            clock(at)
            if w.bin_minutes == 1
            else f"{clock(at)}–{clock(at + w.bin_minutes * MINUTE_MS)}"
        )
        return escape(f"{when}: " + ", ".join(texts))

    def _line(self, top: float) -> list[str]:
        series = self.series[0]
        h = PLOT_H
        points = [
            (self._x(i + 0.5), TOP + h * (1 - (v / top if top else 0)))
            for i, v in enumerate(series.values)
        ]
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        base = TOP + h
        out = [
            f'<polygon class="area" points="{self._x(0.5):.1f},{base} {path} '
            f'{self._x(len(points) - 0.5):.1f},{base}"/>',
            f'<polyline class="line" points="{path}"/>',
        ]
        step = PLOT_W / self.window.bins
        for i, v in enumerate(series.values):
            out.append(
                f'<rect class="hover" x="{self._x(i):.1f}" y="{TOP}" width="{step:.1f}" '
                f'height="{h}"><title>{self._bin_title(i, [f"{number(v)} {self.unit}"])}'
                "</title></rect>"
            )
        return out

    def _bars(self, top: float) -> list[str]:
        h = PLOT_H
        step = PLOT_W / self.window.bins
        out = []
        for i in range(self.window.bins):
            texts = [f"{s.label} {number(s.values[i])}" for s in self.series if s.values[i]]
            if not texts:
                continue
            y: float = TOP + h
            out.append(f"<g><title>{self._bin_title(i, texts)}</title>")
            for k, s in enumerate(self.series):
                if not s.values[i]:
                    continue
                bar = h * s.values[i] / top if top else 0
                y -= bar
                out.append(
                    f'<rect class="s{k}" x="{self._x(i) + step * 0.1:.1f}" y="{y:.1f}" '
                    f'width="{step * 0.8:.1f}" height="{bar:.1f}"/>'
                )
            out.append("</g>")
        return out


def clock(ms: float) -> str:
    """A time of day on the local clock, ``14:05``."""
    return time.strftime("%H:%M", time.localtime(ms / 1000))


def number(value: float) -> str:
    """A value on an axis or in a tooltip: thousands separators, decimals only when small."""
    if value >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:,.1f}" if value >= 10 else f"{value:,.2f}".rstrip("0").rstrip(".")


def nice_top(peak: float) -> float:
    """The top of the value axis: the first 1, 2, 2.5 or 5 times a power of ten that is
    at least *peak* (1 for an empty chart), so that the four gridlines read as round."""
    if peak <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(peak))
    return float(next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= peak))


def _bins(stats: CrawlStats, name: str, window: Window) -> tuple[int, list[float]]:
    """(the first bin's start in ms, the count of *name* in each bin of *window*)."""
    buckets = stats.minutes.get(name, {})
    now_minute = stats.now_ms // MINUTE_MS
    last_bin = now_minute // window.bin_minutes
    first_bin = last_bin - window.bins + 1
    counts = [0.0] * window.bins
    for minute, n in buckets.items():
        b = minute // window.bin_minutes - first_bin
        if 0 <= b < window.bins:
            counts[b] += n
    return first_bin * window.bin_minutes * MINUTE_MS, counts


def rate_chart(stats: CrawlStats, window: Window, *, fitted: bool = True) -> Chart:
    """Pages per second (acks) in each bin of *window* (fitted to a young crawl: see
    :func:`fit`); the newest bin counts over the part of it that has passed, so that a crawl
    that just began shows its pace at once."""
    window = fit(window, stats) if fitted else window
    start, counts = _bins(stats, "acked", window)
    bin_s = window.bin_minutes * 60
    values = [n / bin_s for n in counts]
    passed = (stats.now_ms - (start + (window.bins - 1) * bin_s * 1000)) / 1000
    values[-1] = counts[-1] / max(passed, 1.0)
    series = Series("pages/s", "Requests done (acked) per second", values)
    return Chart("Pages per second", "pages/s", window, start, [series])


def speed(stats: CrawlStats, begun_ms: int | None = None, acked_before: int | None = None) -> float:
    """Pages per second over the last minute (the minute before this one counted for its
    part in that minute, its acks taken as spread evenly over it). A crawl whose first
    acks are this minute's: over the part of it that has passed; the minute before's: at
    least that (it began at a second of it the buckets do not say). A run begun less than a
    minute ago (*begun_ms*): its acks since, over the time since (before: 302 acks in the
    17 s of a run begun 22 s into its minute read 7.6 pages/s, not 17.8); its own acks
    where it recorded the crawl's when it began (*acked_before*), not those of the run
    before in the same minute (a review: 30 pages/s read for 10)."""
    acked = stats.minutes.get("acked", {})
    if not acked or (begun_ms is not None and begun_ms > stats.now_ms):  # (RunState.pace_from)
        return 0.0
    if begun_ms is not None and stats.now_ms - MINUTE_MS < begun_ms <= stats.now_ms:
        since = acks_since(stats, begun_ms // MINUTE_MS, begun_ms, acked_before)
        return since / max((stats.now_ms - begun_ms) / 1000, 1.0)
    now_minute, into = divmod(stats.now_ms, MINUTE_MS)
    so_far = acked.get(now_minute, 0) / max(into / 1000, 1.0)
    first = min(acked)
    if first >= now_minute:
        return so_far
    last_minute = stats.rate("acked", 1) / 60
    return max(last_minute, so_far) if first == now_minute - 1 else last_minute


def class_chart(stats: CrawlStats, event: str, window: Window) -> Chart:
    """*event* (``retried`` or ``dead``) per minute in each bin of *window*, a layer per
    failure class (the :data:`MOST_SERIES` most frequent, the rest summed)."""
    window = fit(window, stats)
    prefix = f"{event}:"
    per_class = {}
    start = 0
    for name in stats.minutes:
        if name.startswith(prefix):
            start, counts = _bins(stats, name, window)
            if any(counts):
                per_class[name[len(prefix) :]] = [n / window.bin_minutes for n in counts]
    start = start or _bins(stats, event, window)[0]
    ranked = sorted(per_class.items(), key=lambda kv: (-sum(kv[1]), kv[0]))
    series = [Series(class_label(c).text, class_label(c).meaning, v) for c, v in ranked]
    if len(series) > MOST_SERIES:
        rest = series[MOST_SERIES - 1 :]
        summed = [sum(s.values[i] for s in rest) for i in range(window.bins)]
        series = [*series[: MOST_SERIES - 1], Series("other classes", "", summed)]
    title = "Retries per minute" if event == "retried" else "Dead letters per minute"
    unit = "retries/min" if event == "retried" else "dead letters/min"
    return Chart(title, unit, window, start, series, bars=True)
