"""The exact set with an age (``HA_DUPEFILTER_TTL``): what the scripts that enqueue are told
of it (``lua/lib/aged.lua``, one kind of ``lua/lib/seen.lua``).

The fingerprints are kept in a ring of time slices, each a set of the fingerprints first seen
while it was the newest, dropped whole once it ended a TTL ago: a URL seen longer ago than the
TTL is new again, with no per-entry expiry and no scan. A Bloom filter cannot forget a URL,
so ``HA_DUPEFILTER = "bloom"`` takes no TTL (:mod:`scrapy_ha.config.scheduler` refuses it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy_ha.store.bloom import Dupefilter

if TYPE_CHECKING:
    from scrapy_ha.keys import Keys

__all__ = ["AgedSet"]


@dataclass
class AgedSet(Dupefilter):
    """The exact set in time slices: a fingerprint is seen for *ttl_ms*."""

    ttl_ms: int

    def extra_keys(self, keys: Keys) -> list[str]:
        return [keys.aged, *keys.aged_slices()]

    def spec(self) -> str:
        return f"set {self.ttl_ms}"
