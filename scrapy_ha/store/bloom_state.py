"""A Bloom filter's state as stored (``lua/lib/bloom.lua``, ``lua/lib/aged.lua``): what
``scrapy-ha status``, the dashboard and the metrics show of it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from scrapy_ha.keys import SEEN_SLICES
from scrapy_ha.store.bloom import layer_bytes
from scrapy_ha.store.bloom_meta import (
    BloomMetaError,
    meta_count,
    meta_layers,
    meta_layout,
    meta_rate,
)
from scrapy_ha.store.wire import text as _s

__all__ = ["BloomState", "bloom_state"]


@dataclass(frozen=True)
class BloomState:
    """A Bloom filter as stored: what ``scrapy-ha status`` and the metrics show. With
    ``HA_DUPEFILTER_TTL`` it is the time slices' (``lua/lib/aged.lua``): the layers of every
    live slice, the bound that of the slices a check reads together."""

    capacity: int
    k: int
    #: the rate asked when it was made (HA_DUPEFILTER_ERROR_RATE)
    asked: float
    #: URLs added to each layer (held by each layer of the live slices)
    added: tuple[int, ...]
    #: bytes of each layer's bitmaps
    layer_bytes: tuple[int, ...]
    #: false positives to expect so far (URLs never crawled): an estimate
    expected_false_positives: float
    #: time slices: the live ones (0: a filter kept for ever), and the bit positions of each
    #: layer (else k + its index)
    slices: int = 0
    positions: tuple[int, ...] = ()

    @property
    def urls(self) -> int:
        return sum(self.added)

    @property
    def bytes(self) -> int:
        return sum(self.layer_bytes)

    @property
    def bound(self) -> float:
        """The most the filter errs however far it grows: 2^-(k-1), times the slices a
        check reads at most."""
        checked = SEEN_SLICES + 1 if self.slices else 1
        return float(checked * 2.0 ** -(self.k - 1))

    @property
    def error_now(self) -> float:
        """The probability that a new URL is taken for a seen one now (never crawled): the
        sum of each layer's (a bound, exact to the first order, that never rounds to 0)."""
        error = 0.0
        for i, (n, size) in enumerate(zip(self.added, self.layer_bytes, strict=True)):
            k, m = (self.positions[i] if self.positions else self.k + i), size * 8
            error += (-math.expm1(-k * n / m)) ** k
        return error


def bloom_state(meta: dict[Any, Any], now_ms: int = 0) -> BloomState | None:
    """The filter a meta hash (read with HGETALL) describes; None when it is not one. Time
    slices are those a check reads at *now_ms* (the server's time; 0: every slot held). A
    hash scrapy-ha cannot have written raises :class:`~scrapy_ha.store.bloom.BloomMetaError`."""
    fields = {_s(k): _s(v) for k, v in meta.items()}
    if "capacity" not in fields:
        if any(name in fields for name in ("k", "part", "layers", "period")):
            # a filter's hash without its capacity: unreadable, where the tools showed no
            # dupefilter at all (a QA run)
            raise BloomMetaError("no field 'capacity'")
        return None
    capacity, k, part = meta_layout(fields)
    asked, fp = meta_rate(fields, "error", 0.0), meta_rate(fields, "fp", 0.0)
    meta_count(fields, "n", missing=0)  # the scripts refuse any other (the crawl's count)
    if "period" in fields:
        return _slices_state(fields, capacity, k, part, now_ms)
    layers = meta_layers(fields, "layers")
    return BloomState(
        capacity,
        k,
        asked,
        tuple(meta_count(fields, f"n:{i}", missing=0) for i in range(layers)),
        tuple(layer_bytes(capacity, k, part, i) for i in range(layers)),
        fp,
    )


def _slices_state(
    fields: dict[str, str], capacity: int, k: int, part: int, now_ms: int
) -> BloomState:
    """The time slices of Bloom filters a meta hash describes (``lua/lib/aged.lua``)."""
    live = [i for i in range(SEEN_SLICES + 1) if f"s{i}" in fields]
    if now_ms:
        live = _unexpired(fields, live, now_ms)
    layers = [(i, j) for i in live for j in range(meta_layers(fields, f"l{i}"))]
    return BloomState(
        capacity,
        k,
        meta_rate(fields, "error", 0.0),
        tuple(meta_count(fields, f"n{i}:{j}", missing=0) for i, j in layers),
        tuple(layer_bytes(capacity, k, part, j) for _, j in layers),
        meta_rate(fields, "fp", 0.0),
        slices=len(live),
        positions=tuple(k + j for _, j in layers),
    )


def _unexpired(fields: dict[str, str], live: list[int], now_ms: int) -> list[int]:
    """The slots of *live* a check reads at *now_ms*: a slot ends a period after its start,
    or where the next newer one starts if that is sooner, and one that ended a TTL ago (8
    periods: the TTL less its remainder, a few ms) is no longer read, though it is held
    until the next write drops it (``lua/lib/aged.lua``: aged_order, aged_newest)."""
    period = meta_count(fields, "period", low=1)
    starts = {i: meta_count(fields, f"s{i}") for i in live}
    newest_first = sorted(live, key=starts.__getitem__, reverse=True)
    kept, newer = [], 0
    for i in newest_first:
        start = starts[i]
        end = min(start + period, newer) if newer else start + period
        if end > now_ms - period * SEEN_SLICES:
            kept.append(i)
        newer = start
    return kept
