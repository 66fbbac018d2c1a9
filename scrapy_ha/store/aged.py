"""The dupefilter with an age (``HA_DUPEFILTER_TTL``): what the scripts that enqueue are told
of it (``lua/lib/aged.lua``, a kind of ``lua/lib/seen.lua``).

The fingerprints are kept in a ring of time slices, each holding those first seen while it
was the newest, dropped whole once it ended a TTL ago: a URL seen longer ago than the TTL is
new again, with no per-entry expiry and no scan. With the exact set each slice is a set of
12-byte fingerprints (:class:`AgedSet`); with ``HA_DUPEFILTER = "bloom"`` each is a scalable
Bloom filter (:class:`AgedBloom`): a Bloom filter cannot take a URL out, but it can be
dropped whole.

Sizing the Bloom slices: a slice takes the URLs new within a TTL/8, so its first layer holds
``HA_DUPEFILTER_CAPACITY / 8`` of them (the capacity being the URLs new within a TTL; a
busier slice grows a layer, as the plain filter does). A URL is checked against up to 9
slices (those within its age), whose errors add up: each slice is made to err at most
``HA_DUPEFILTER_ERROR_RATE / 9``, so that a check errs at most the rate asked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from scrapy_ha.keys import SEEN_SLICES
from scrapy_ha.store import scripts
from scrapy_ha.store.bloom import (
    BLOOM_FINGERPRINT_BYTES,
    MAX_PART_BYTES,
    Dupefilter,
    bloom_k,
    meta_count,
    meta_layout,
)
from scrapy_ha.store.bloom_meta import meta_rate
from scrapy_ha.store.wire import text as _s

if TYPE_CHECKING:
    from scrapy_ha.keys import Keys

__all__ = ["AgedBloom", "AgedSet", "set_slice_where", "slice_capacity", "slices_where"]

#: Slices a check reads at most (those within the TTL, and the newest): their errors add up.
CHECKED_SLICES = SEEN_SLICES + 1


@dataclass
class AgedSet(Dupefilter):
    """The exact set in time slices: a fingerprint is seen for *ttl_ms*."""

    ttl_ms: int

    def extra_keys(self, keys: Keys, new: int = 0) -> list[str]:  # noqa: ARG002
        # the buckets' meta hash first: read only, so that slices are never made beside
        # buckets another worker made (lua/lib/seen.lua's rule, one kind)
        return [keys.buckets, keys.aged, *keys.aged_slices()]

    def spec(self, new: int = 0) -> str:  # noqa: ARG002
        return f"set {self.ttl_ms}"

    def settings(self) -> str:
        return f"HA_DUPEFILTER='set' with HA_DUPEFILTER_TTL={self.ttl_ms / 1000:g}"


def slice_capacity(capacity: int) -> int:
    """URLs the first layer of a Bloom slice holds: the crawl's *capacity* (URLs new within
    a TTL) over the slices that cover the TTL."""
    return max(1, math.ceil(capacity / SEEN_SLICES))


@dataclass
class AgedBloom(Dupefilter):
    """Time slices of Bloom filters (``HA_DUPEFILTER = "bloom"`` with ``HA_DUPEFILTER_TTL``).

    *capacity* and *k* are a slice's (:func:`slice_capacity`, and the positions that make a
    slice err at most *error_rate* / 9): the scripts use the layout stored by the crawl's
    first call when there is one, and name the slices' bitmaps from the meta hash."""

    capacity: int
    error_rate: float
    ttl_ms: int
    k: int = 0
    part: int = MAX_PART_BYTES
    fingerprint_bytes: int = field(default=BLOOM_FINGERPRINT_BYTES, init=False)

    def __post_init__(self) -> None:
        self.k = self.k or bloom_k(self.error_rate / CHECKED_SLICES)

    @classmethod
    def for_crawl(cls, capacity: int, error_rate: float, ttl_ms: int) -> AgedBloom:
        """The slices of a crawl of *capacity* URLs new within a TTL, erring *error_rate*."""
        return cls(slice_capacity(capacity), error_rate, ttl_ms)

    @classmethod
    def stored(cls, meta: dict[str, str]) -> AgedBloom | None:
        """The slices a meta hash describes (read with HGETALL, decoded); None if not such."""
        if "period" not in meta or "capacity" not in meta:
            return None
        capacity, k, part = meta_layout(meta)
        ttl_ms = meta_count(meta, "period", low=1) * SEEN_SLICES
        return cls(capacity, meta_rate(meta, "error", 0.5), ttl_ms, k, part)

    def key(self, keys: Keys) -> str:
        return keys.bloom

    def settings(self) -> str:
        return f"HA_DUPEFILTER='bloom' with HA_DUPEFILTER_TTL={self.ttl_ms / 1000:g}"

    def spec(self, new: int = 0) -> str:  # noqa: ARG002
        rate = repr(self.error_rate)
        return f"bloom-ttl {self.ttl_ms} {self.capacity} {self.k} {self.part} {rate}"


async def slices_where(client: Any, keys: Keys, fingerprints: list[bytes]) -> list[int]:
    """For each fingerprint (16 bytes), the start (server ms) of the newest Bloom slice
    within the TTL that holds it (0: none), or [] when the crawl has no Bloom slices."""
    raw = await client.hgetall(keys.bloom)
    meta = {_s(k): _s(v) for k, v in raw.items()}
    slices = AgedBloom.stored(meta)
    if slices is None:
        return []
    script = client.register_script(scripts.SEEN_CHECK_LUA)
    reply = await script(keys=[keys.bloom, keys.queues], args=[slices.spec(), *fingerprints])
    return [int(x) for x in reply[:-1]]


async def set_slice_where(client: Any, keys: Keys, fingerprint: bytes) -> int:
    """The start (server ms) of the newest of the exact set's time slices that holds
    *fingerprint* (12 bytes) within the TTL, as the scripts that enqueue read them: 0 when
    none does, or the crawl has no such slices. A slot that ended a TTL ago holds nothing,
    though it stays in Redis until the crawl's next write drops it (a crawl at rest keeps
    it: read by SISMEMBER alone, such a URL was said seen while a link to it was crawled)."""
    period = await client.hget(keys.aged, "period")
    if period is None:
        return 0
    ttl_ms = max(int(period), 1) * SEEN_SLICES
    slices = AgedSet(ttl_ms)
    script = client.register_script(scripts.SEEN_CHECK_LUA)
    reply = await script(
        keys=[keys.dupefilter, keys.queues, *slices.extra_keys(keys)],
        args=[slices.spec(), fingerprint],
    )
    return int(reply[0])
