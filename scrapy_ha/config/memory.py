"""What a crawl may spend of Redis's memory: the dupefilter's kind and size
(``HA_DUPEFILTER*``) and the marks of the back-pressure (``HA_REDIS_MEMORY_HIGH`` and
``_LOW``), read and checked once (:class:`MemoryConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy_ha.config import validate as check
from scrapy_ha.config.validate import ConfigError

if TYPE_CHECKING:
    from typing import Self

    from scrapy.settings import BaseSettings

__all__ = ["DUPEFILTERS", "MemoryConfig"]

#: The dupefilter kinds: the exact set (the default: never wrong) or a Bloom filter.
DUPEFILTERS = ("set", "bloom")
#: URLs the Bloom filter's first layer holds at its error: 38 MB at 1e-6, allocated by the
#: first request (fine on a laptop's Redis), and a crawl of a billion URLs grows only 7
#: layers from it (each twice the last).
DEFAULT_DUPEFILTER_CAPACITY = 10_000_000
#: The false-positive rate the Bloom filter keeps, however far it grows: a URL in a million
#: is never crawled, for 3.8 bytes of Redis per URL (1e-3 would cost 2 bytes).
DEFAULT_DUPEFILTER_ERROR_RATE = 1e-6
#: The range of rates allowed: below 1e-12 a filter costs more than the exact set (12-byte
#: fingerprints); above 0.1 it loses more than it saves.
ERROR_RATE_RANGE = (1e-12, 0.1)
#: The largest first layer: its second, which a worker asks for with its first URL, stays
#: under the largest layer any reader accepts (store.bloom.MAX_LAYER_BYTES, 2^40 bytes) at
#: the tightest error rate (1e-12: 0.76 TB); and positions stay exact in a Lua number.
#: Above it, 10^12 failed at the first URL as a filter "no worker can have written".
MAX_DUPEFILTER_CAPACITY = 5 * 10**10
#: The smallest first layer: a sync call's 500 new requests then never fill more than the
#: one layer it may add (a call knows the bitmaps of one layer ahead).
MIN_DUPEFILTER_CAPACITY = 1000
#: Redis's used_memory, as a fraction of maxmemory, above which workers lease nothing new:
#: a tenth of maxmemory stays for what workers still store (the children of the pages they
#: hold) and Redis's own buffers.
DEFAULT_MEMORY_HIGH = 0.9
#: The mark below which workers lease again: a tenth under the high one, so that a crawl
#: does not stop and start at each page around one mark.
DEFAULT_MEMORY_LOW = 0.8
#: The least mark in bytes: an empty Redis uses about 1 MB.
MIN_MARK_BYTES = 1 << 20
#: Seconds between two reads of Redis's memory by a worker: INFO costs the server
#: microseconds, and a worker stores at most a second of children past the mark.
MEMORY_CHECK_INTERVAL = 1.0
#: Seconds between two reads while no mark applies (the marks are fractions and no server
#: has a maxmemory): the read then only watches for a maxmemory set during the crawl.
MEMORY_UNBOUNDED_INTERVAL = 30.0
#: New requests stored compacted with the crawl's dictionary (codec.compact): a realistic
#: request takes 23 bytes of Redis instead of 124, for about 5 µs of a worker's CPU.
DEFAULT_COMPACT_PAYLOADS = True


def _mark(settings: BaseSettings, name: str, default: float) -> float:
    """A mark: a fraction of maxmemory (0 to 1), a number of bytes (above 1), or 0 (off)."""
    value = check.non_negative(settings, name, default, finite=True)
    if value > 1 and value != int(value):
        raise ConfigError(
            f"{name}={value!r} must be a fraction of maxmemory (0 to 1) or a whole number of bytes"
        )
    if 1 < value < MIN_MARK_BYTES:  # (a QA run: 90, meant as 90 %, held every lease for ever)
        percent = f": {value / 100:g} for {value:g} %" if value <= 100 else ""
        raise ConfigError(
            f"{name}={settings.get(name)!r} is {value:.0f} bytes, less than an empty Redis "
            f"uses: give a fraction of maxmemory (0 to 1{percent}) or at least "
            f"{MIN_MARK_BYTES} bytes"
        )
    return value


def _low_mark(settings: BaseSettings, high: float) -> float:
    """``HA_REDIS_MEMORY_LOW``; left out with the high mark in bytes, 8/9 of it (as 0.8 is
    of 0.9): the default fraction of a maxmemory left a mark in bytes without its margin
    (taken as the high mark itself: a QA run), or with none on a Redis without maxmemory."""
    if high > 1 and not check.given(settings, "HA_REDIS_MEMORY_LOW"):
        return float(int(high * DEFAULT_MEMORY_LOW / DEFAULT_MEMORY_HIGH))
    return _mark(settings, "HA_REDIS_MEMORY_LOW", DEFAULT_MEMORY_LOW)


@dataclass(frozen=True)
class MemoryConfig:
    """The dupefilter, the back-pressure marks and the compaction of stored requests."""

    dupefilter: str = DUPEFILTERS[0]
    capacity: int = DEFAULT_DUPEFILTER_CAPACITY
    error_rate: float = DEFAULT_DUPEFILTER_ERROR_RATE
    #: fractions of maxmemory (at most 1) or bytes (above 1); 0: no back-pressure
    high: float = DEFAULT_MEMORY_HIGH
    low: float = DEFAULT_MEMORY_LOW
    #: HA_COMPACT_PAYLOADS: new requests stored compacted (scrapy_ha.store.dictionary)
    compact_payloads: bool = DEFAULT_COMPACT_PAYLOADS

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Self:
        config = cls(
            dupefilter=check.choice(settings, "HA_DUPEFILTER", DUPEFILTERS[0], DUPEFILTERS),
            capacity=check.whole(
                settings,
                "HA_DUPEFILTER_CAPACITY",
                DEFAULT_DUPEFILTER_CAPACITY,
                minimum=MIN_DUPEFILTER_CAPACITY,
            ),
            error_rate=check.number(
                settings, "HA_DUPEFILTER_ERROR_RATE", DEFAULT_DUPEFILTER_ERROR_RATE
            ),
            high=(high := _mark(settings, "HA_REDIS_MEMORY_HIGH", DEFAULT_MEMORY_HIGH)),
            low=_low_mark(settings, high),
            compact_payloads=check.boolean(
                settings, "HA_COMPACT_PAYLOADS", DEFAULT_COMPACT_PAYLOADS
            ),
        )
        config.validate()
        return config

    def validate(self) -> None:
        low, high = ERROR_RATE_RANGE
        if not low <= self.error_rate <= high:
            raise ConfigError(
                f"HA_DUPEFILTER_ERROR_RATE={self.error_rate!r} must be between {low:g} and "
                f"{high:g} (1e-6: a URL in a million is never crawled)"
            )
        if self.capacity > MAX_DUPEFILTER_CAPACITY:
            raise ConfigError(
                f"HA_DUPEFILTER_CAPACITY={self.capacity} must be {MAX_DUPEFILTER_CAPACITY:g} "
                "or fewer (the filter grows past its capacity by itself)"
            )
        if self.high and not self.low:
            raise ConfigError(
                f"HA_REDIS_MEMORY_LOW={self.low!r} would never let workers lease again once "
                f"HA_REDIS_MEMORY_HIGH={self.high!r} held them back: give a mark below it "
                "(0 switches off HA_REDIS_MEMORY_HIGH, not this one)"
            )
        if self.high and (self.high > 1) != (self.low > 1):
            raise ConfigError(
                f"HA_REDIS_MEMORY_LOW={self.low!r} and HA_REDIS_MEMORY_HIGH={self.high!r} must "
                "be of the same units: both fractions of maxmemory (0 to 1), or both bytes"
            )
        if self.high and self.low >= self.high:
            raise ConfigError(
                f"HA_REDIS_MEMORY_LOW={self.low!r} must be below HA_REDIS_MEMORY_HIGH="
                f"{self.high!r}: workers lease again once Redis's memory falls below it"
            )

    def marks(self, maxmemory: int) -> tuple[int, int] | None:
        """(high, low) in bytes for a Redis with *maxmemory* (0: none), or None when there
        is no back-pressure (marks off, or fractions of a maxmemory that is not set)."""
        if not self.high:
            return None
        high = _bytes(self.high, maxmemory)
        low = _bytes(self.low, maxmemory)
        if high is None:
            return None
        return high, min(low if low is not None else high, high)


def _bytes(mark: float, maxmemory: int) -> int | None:
    if mark > 1:
        return int(mark)
    return int(mark * maxmemory) if maxmemory else None
