"""The static-site benchmark's spider: / -> list pages -> detail pages, as bench/spider.py,
and it keeps the time of every response, so that the benchmark can take the rate in the
middle of the crawl (start-up, the first pages and the end left out).

At close it writes ``{"pages", "seconds", "middle_rate", "reason", "gc", "heap"}`` to the
BENCH_OUT file; ``gc`` is the CPU time the process spent in Python's cyclic garbage collector,
in all and per generation, with the number of collections (the more objects live, the more
each collection of the oldest generation costs, and py-spy charges that time to whichever
frame allocated); ``heap`` the objects the collector tracks at the first response and at
close, and the cancelled Twisted timers still queued at close.

Two settings change the process, to measure what they save (``static_bench.py``'s
``*-freeze`` and ``*-tick`` variants): ``BENCH_GC_FREEZE`` moves every object alive at the
first response out of the collector's reach (``gc.freeze()``), as scrapy-ha does at open
with ``HA_GC_FREEZE`` (its default); ``BENCH_TWISTED_TICK`` runs a Twisted timer every
second, as scrapy-ha does with ``HA_TIMER_SWEEP``: the asyncio reactor drops cancelled timers
(every download's timeout) only when one of its timers fires, and in a busy crawl none does
for minutes.
"""

from __future__ import annotations

import gc
import json
import time
from typing import TYPE_CHECKING, Any

import scrapy

if TYPE_CHECKING:
    from collections.abc import Iterator


class GcClock:
    """The CPU time spent in the cyclic garbage collector, per generation (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.collections = [0, 0, 0]
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.process_time()
            return
        generation = info["generation"]
        self.seconds[generation] += time.process_time() - self._started
        self.collections[generation] += 1

    def stop(self) -> dict[str, Any]:
        gc.callbacks.remove(self._callback)
        return {
            "seconds": sum(self.seconds),
            "seconds_by_generation": self.seconds,
            "collections": self.collections,
        }


def _cancelled_timers() -> int:
    """Cancelled Twisted timers the reactor still holds (each a DelayedCall and two bound
    methods for the collector to walk)."""
    from twisted.internet import reactor

    pending = getattr(reactor, "_pendingTimedCalls", [])  # ReactorBase's own heap
    return sum(1 for call in pending if call.cancelled)


#: The middle of the crawl: the responses between these fractions of all of them.
MIDDLE = (0.25, 0.75)


def middle_rate(times: list[float]) -> float:
    """Responses per second between the first and the last of the middle half of *times*."""
    if len(times) < 4:
        return 0.0
    first, last = (int(len(times) * f) for f in MIDDLE)
    seconds = times[last] - times[first]
    return (last - first) / seconds if seconds > 0 else 0.0


class StaticBenchSpider(scrapy.Spider):
    name = "static-bench"

    def __init__(self, base_url: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_urls = [base_url + "/"]
        self.times: list[float] = []
        self.gc_clock = GcClock()
        self.objects_at_first = 0

    def parse(self, response: Any) -> Iterator[Any]:
        if not self.times:
            self.first_response()
        self.times.append(time.monotonic())
        for href in response.css("a.item::attr(href)").getall():
            yield response.follow(href, callback=self.parse_item)
        for href in response.css("a.next::attr(href)").getall():
            yield response.follow(href, callback=self.parse)

    def first_response(self) -> None:
        self.objects_at_first = len(gc.get_objects())
        if self.settings.getbool("BENCH_GC_FREEZE"):  # as scrapy_ha.scheduler.session.heap does
            gc.collect()
            gc.freeze()
        if self.settings.getbool("BENCH_TWISTED_TICK"):
            from twisted.internet import task

            self.tick = task.LoopingCall(lambda: None)
            self.tick.start(1.0, now=False)

    def parse_item(self, response: Any) -> Iterator[dict[str, Any]]:
        self.times.append(time.monotonic())
        yield {"id": response.css("span.id::text").get()}

    def closed(self, reason: str) -> None:
        out = self.settings.get("BENCH_OUT")
        if not out:
            return
        with open(out, "w") as f:
            json.dump(
                {
                    "pages": len(self.times),
                    "seconds": self.times[-1] - self.times[0] if self.times else 0.0,
                    "middle_rate": middle_rate(self.times),
                    "reason": reason,
                    "gc": self.gc_clock.stop(),
                    "heap": {
                        "objects_at_first": self.objects_at_first,
                        "objects_at_close": len(gc.get_objects()),
                        "cancelled_twisted_timers": _cancelled_timers(),
                    },
                },
                f,
            )
