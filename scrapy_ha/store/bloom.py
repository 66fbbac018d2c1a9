"""The crawl's dupefilter as the scripts that enqueue are told of it (``lua/lib/seen.lua``):
the exact set, or a scalable Bloom filter in plain Redis bitmaps (``HA_DUPEFILTER``).

A script learns the kind from a *spec*, its last argument, and finds a filter's bitmaps at
the end of its ``KEYS``. A client knows the filter's layout (its parameters, and how many
layers exist) and passes the bitmaps of every layer it knows and of the next one, so a
full layer grows in the same call; a client that knows too few layers (another worker's
call grew one) is refused before any write with ``BLOOMLAYOUT ...``, learns the filter as
stored from the error and calls again (:meth:`BloomFilter.adopt`). The layout is computed
here exactly as in ``lua/lib/bloom.lua`` (integers and one multiplication of doubles, exact
on every IEEE machine), so both name the same keys: ``tests/test_bloom.py`` checks they
agree.

A false positive of the filter is a URL never crawled: the crawl is told the rate asked
(``HA_DUPEFILTER_ERROR_RATE``), the bound the layout keeps, and the rate it runs at now
(:func:`bloom_state`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

from scrapy_ha.config.validate import ConfigError
from scrapy_ha.keys import SEEN_SLICES
from scrapy_ha.store.bloom_meta import (
    MAX_LAYERS,
    BloomMetaError,
    meta_count,
    meta_layers,
    meta_layout,
    meta_rate,
)
from scrapy_ha.store.wire import text as _s

if TYPE_CHECKING:
    from scrapy_ha.keys import Keys

__all__ = [
    "first_layer_room",
    "BLOOM_FINGERPRINT_BYTES",
    "MAX_PART_BYTES",
    "BloomFilter",
    "BloomMetaError",
    "Dupefilter",
    "DupefilterRefused",
    "ExactSet",
    "bitmap_keys",
    "bloom_k",
    "filter_keys",
    "filter_metas",
    "layer_bytes",
    "layer_parts",
    "layer_sizes",
    "meta_count",
    "meta_layers",
    "meta_layout",
    "seen_call",
    "slice_keys",
]

#: Bytes a string key of 64 KB .. 4 GB costs Redis beyond its content (header 9, end 1).
SDS_BYTES = 10
#: The largest part of a filter: a Redis string holds at most 512 MB, and one of exactly
#: 2^29 - 10 bytes is allocated 2^29 (one more byte would cost the next size class, 640 MB).
MAX_PART_BYTES = 2**29 - SDS_BYTES
#: A remainder of a layer this small is one part as it is (a few KB of rounding at most),
#: and so is one of at most 1/TAIL of the layer (its rounding costs at most 0.4 %): a layer
#: has few parts, so a call passes few keys.
SMALL_PART_BYTES = 65536
TAIL = 64
#: Bits per URL per position: m / n = k / ln 2 sets half the bits of a layer at capacity.
INV_LN2 = 1.4426950408889634
#: Fingerprint bytes sent with a Bloom filter: 4 that place the request on a shard, then two
#: 48-bit hashes (each exact in a Lua number) that give its k bit positions.
BLOOM_FINGERPRINT_BYTES = 16
#: The scripts' refusal when the client's layout is not the stored one.
LAYOUT_ERROR = re.compile(r"BLOOMLAYOUT (\d+) (\d+) (\d+) (\d+)")
#: The scripts' refusal of a dupefilter of another kind than the crawl's (lua/lib/seen.lua's
#: rule, one kind): "SEENKIND <script>: <what the crawl keeps, and where>".
KIND_ERROR = re.compile(r"SEENKIND \S+: (.*)")


#: The most bytes a layer may hold: 1 TiB, more than any Redis server's memory (a larger
#: layer in a meta hash is no filter's: its parts would be counted for ever).
MAX_LAYER_BYTES = 2**40
#: The most parts a layer may have: one of 1 TiB in parts of 512 MB has 2,048 (a meta hash
#: of tiny parts asking more would have a reader list billions of keys).
MAX_LAYER_PARTS = 2**16


def bloom_k(error_rate: float) -> int:
    """Bit positions per URL of the first layer: the least k whose layers all together err
    at most *error_rate* (layer i errs 2^-(k+i) at capacity: the sum stays below 2^-(k-1))."""
    return max(1, math.ceil(-math.log2(error_rate)) + 1)


def _fitted(rest: int) -> int:
    """The largest part of at most *rest* bytes whose allocation is a jemalloc size class
    (four per doubling: 2^g, 1.25, 1.5, 1.75 times 2^g)."""
    g = 1
    while g * 2 <= rest + SDS_BYTES:
        g *= 2
    for j in (3, 2, 1):
        c = g + j * (g // 4)
        if c - SDS_BYTES <= rest:
            return c - SDS_BYTES
    return g - SDS_BYTES


def layer_bytes(capacity: int, k: int, part: int, layer: int) -> int:
    """The bytes of *layer* (the sum of its parts' sizes), computed without listing them; a
    BloomMetaError for a layout no filter has: a field below 1, a layer beyond MAX_LAYERS,
    more than MAX_LAYER_BYTES or more than MAX_LAYER_PARTS parts (what a reader would
    otherwise list, one item per part, for as long as it takes)."""
    if min(capacity, k, part) < 1 or not 0 <= layer <= MAX_LAYERS:
        raise BloomMetaError(f"capacity {capacity}, k {k}, part {part}, layer {layer}")
    positions = (capacity << layer) * (k + layer)  # bits >= positions: checked before floats
    total = -(-math.ceil(positions * INV_LN2) // 8) if positions <= MAX_LAYER_BYTES * 8 else 0
    if not 0 < total <= MAX_LAYER_BYTES:
        raise BloomMetaError(
            f"layer {layer} of capacity {capacity} and k {k} would hold more than "
            f"{MAX_LAYER_BYTES} bytes"
        )
    if total // part > MAX_LAYER_PARTS:
        raise BloomMetaError(
            f"layer {layer} would have more than {MAX_LAYER_PARTS} parts of {part} bytes"
        )
    return total


def first_layer_room(
    capacity: int, error_rate: float, info: dict[str, Any], *, layers: int = 1
) -> str | None:
    """Why *layers* new Bloom filters' first layers (one a shard) cannot fit in the Redis of
    *info* (its ``INFO``: ``maxmemory`` less ``used_memory``), or None. A layer's bitmaps are
    made whole by the first URL stored: in a Redis without room, every write is refused and
    the crawl waits for ever (a QA run: a 36 MB first layer in a 20 MB Redis)."""
    maxmemory = int(info.get("maxmemory", 0) or 0)
    used = int(info.get("used_memory", 0) or 0)
    if not maxmemory:
        return None
    first = layer_bytes(capacity, bloom_k(error_rate), MAX_PART_BYTES, 0) * layers
    if first <= maxmemory - used:
        return None
    which = "first layer takes" if layers == 1 else f"first layers ({layers} shards) take"
    return (
        f"HA_DUPEFILTER='bloom': its {which} {first / 2**20:,.1f} MB "
        f"(HA_DUPEFILTER_CAPACITY={capacity}, HA_DUPEFILTER_ERROR_RATE={error_rate:g}), and "
        f"Redis has {max(0, maxmemory - used) / 2**20:,.1f} MB left of its maxmemory "
        f"{maxmemory / 2**20:,.1f} MB: it would refuse every write of the crawl. Raise "
        "maxmemory, or lower HA_DUPEFILTER_CAPACITY (the filter grows past it by itself)"
    )


def _tail(rest: int, total: int) -> list[int]:
    """The sizes of the parts of the last *rest* bytes of a layer of *total*, less than a
    part: one part as it is, or a few of sizes that are size classes (each at least 4/5 of
    what is left, so a handful)."""
    sizes = []
    while rest > 0:
        size = _fitted(rest) if rest > SMALL_PART_BYTES and rest * TAIL > total else rest
        sizes.append(size)
        rest -= size
    return sizes


def layer_sizes(capacity: int, k: int, part: int, layer: int) -> list[int]:
    """The byte sizes of the parts of *layer* (as ``bloom_layer`` in ``lib/bloom.lua``); a
    BloomMetaError for a layout no filter has (:func:`layer_bytes`)."""
    total = layer_bytes(capacity, k, part, layer)
    return [part] * (total // part) + _tail(total % part, total)


def layer_parts(capacity: int, k: int, part: int, layer: int) -> int:
    """How many parts *layer* has (``len(layer_sizes(...))``, without listing the whole ones)."""
    total = layer_bytes(capacity, k, part, layer)
    return total // part + len(_tail(total % part, total))


class Dupefilter:
    """What the scripts that enqueue are told of the crawl's dupefilter."""

    #: fingerprint bytes sent per request
    fingerprint_bytes = 12

    def key(self, keys: Keys) -> str:
        """The dupefilter key the scripts take (the set, or the filter's meta hash)."""
        return keys.dupefilter

    def extra_keys(self, keys: Keys, new: int = 0) -> list[str]:  # noqa: ARG002
        """The keys the scripts take last (a filter's bitmaps), for a call of up to *new*
        new URLs."""
        return []

    def spec(self, new: int = 0) -> str:  # noqa: ARG002
        """The scripts' last argument (see ``lua/lib/seen.lua``), for a call of up to *new*
        new URLs."""
        return "set"

    def wire(self, fingerprint: bytes) -> bytes:
        """A fingerprint as the scripts take it (the buckets take another form)."""
        return fingerprint

    def adopt(self, exc: Exception) -> bool:
        """Learn the stored layout from a script's refusal; False: not such a refusal."""
        return False

    def settings(self) -> str:
        """The settings that chose this kind, for an error that names them."""
        return "HA_DUPEFILTER='set' without HA_DUPEFILTER_TTL"


class ExactSet(Dupefilter):
    """The exact set as one set of 12-byte fingerprints: a crawl made before the buckets
    (:mod:`scrapy_ha.store.buckets`) keeps it."""


@dataclass
class BloomFilter(Dupefilter):
    """A scalable Bloom filter (``HA_DUPEFILTER = "bloom"``) as this client knows it."""

    capacity: int
    error_rate: float
    k: int = 0
    part: int = MAX_PART_BYTES
    #: layers this client knows exist
    layers: int = 0
    fingerprint_bytes: int = field(default=BLOOM_FINGERPRINT_BYTES, init=False)

    def __post_init__(self) -> None:
        self.k = self.k or bloom_k(self.error_rate)

    def key(self, keys: Keys) -> str:
        return keys.bloom

    def sizes(self, layer: int) -> list[int]:
        return layer_sizes(self.capacity, self.k, self.part, layer)

    def passed(self, new: int = 0) -> int:
        """The last layer whose bitmaps a call of up to *new* new URLs passes: the first
        layer that does not exist yet (at least layer 1, so that a new filter's first layer
        can grow in one call), and past it as many as *new* URLs could fill once the last
        that exists is full (each layer holds twice the one before): a call never fills a
        layer past its capacity for want of the next one's keys."""
        last = max(self.layers, 1)
        room = self.capacity << last
        while room < new:
            last += 1
            room += self.capacity << last
        return last

    def extra_keys(self, keys: Keys, new: int = 0) -> list[str]:
        return self.all_keys(keys, self.passed(new) + 1)

    def all_keys(self, keys: Keys, layers: int) -> list[str]:
        """The bitmaps of *layers* layers (for a flush or a finish)."""
        return [
            keys.bloom_part(layer, j)
            for layer in range(layers)
            for j in range(layer_parts(self.capacity, self.k, self.part, layer))
        ]

    def spec(self, new: int = 0) -> str:
        rate = repr(self.error_rate)
        return f"bloom {self.capacity} {self.k} {self.part} {self.passed(new)} {rate}"

    def settings(self) -> str:
        return "HA_DUPEFILTER='bloom' without HA_DUPEFILTER_TTL"

    def adopt(self, exc: Exception) -> bool:
        found = LAYOUT_ERROR.search(str(exc))
        if not found:
            return False
        self.capacity, self.k, self.part, self.layers = (int(x) for x in found.groups())
        return True

    def learn(self, meta: dict[str, str]) -> bool:
        """Take the layout of a filter read from Redis (its meta hash); False if none."""
        if "capacity" not in meta:
            return False
        self.capacity, self.k, self.part = meta_layout(meta)
        self.layers = meta_layers(meta, "layers")
        self.error_rate = meta_rate(meta, "error", self.error_rate)
        return True


#: Calls of one script a client makes at most while it learns the layout of the filter.
LAYOUT_TRIES = 3


class DupefilterRefused(ConfigError):
    """The crawl in Redis keeps another kind of dupefilter than this worker's settings ask
    for (a worker with ``HA_DUPEFILTER_TTL`` and one without started the crawl together,
    both before either wrote one): the script refused the call before any write. A
    settings mismatch: no retry can fix it, the worker stops (the message names the
    settings, what the crawl keeps, and the fix)."""

    @classmethod
    def of(cls, exc: Exception, dupefilter: Dupefilter, keys: Keys) -> DupefilterRefused | None:
        """The refusal a script's error *exc* means for a worker of *dupefilter*; None if
        it is another error."""
        found = KIND_ERROR.search(str(exc))
        if not found:
            return None
        return cls(
            f"this worker's {dupefilter.settings()} does not fit the crawl of {keys.spider} in "
            f"Redis: {found[1]} (another worker of the crawl started with other settings and "
            "wrote first): run every worker of the crawl with the same HA_DUPEFILTER and "
            f"HA_DUPEFILTER_TTL, or `scrapy-ha flush {keys.spider}` first to start it again"
        )


async def seen_call(
    script: Any,
    dupefilter: Dupefilter,
    keys: Keys,
    *,
    call_keys: list[str],
    args: list[Any],
    new: int = 0,
) -> Any:
    """Run a script that enqueues up to *new* URLs (*script*: a registered script) with the
    dupefilter's bitmaps after *call_keys* and its spec after *args*. A refusal because the
    filter grew a layer this client did not know (the script wrote nothing) teaches it the
    layout, and the call is made again. A dupefilter of another kind than the crawl's raises
    :class:`DupefilterRefused` (the script wrote nothing)."""
    for attempt in range(LAYOUT_TRIES):
        try:
            extra = dupefilter.extra_keys(keys, new)
            return await script(keys=[*call_keys, *extra], args=[*args, dupefilter.spec(new)])
        except redis.exceptions.ResponseError as exc:
            if refused := DupefilterRefused.of(exc, dupefilter, keys):
                raise refused from exc
            if attempt + 1 == LAYOUT_TRIES or not dupefilter.adopt(exc):
                raise
    raise AssertionError("not reached")


async def filter_keys(client: Any, keys: Keys) -> list[str]:
    """Every bitmap of the crawl's Bloom filter, as stored (none without a filter): its
    layers', or those of each of its time slices (``lua/lib/aged.lua`` names them from the
    meta hash: ``<meta>:s<slice>:<layer>:<part>``); none from a meta hash that holds
    garbage (the flush deletes every key under its name as well)."""
    try:
        return bitmap_keys(keys, await client.hgetall(keys.bloom))
    except BloomMetaError:
        return []


def bitmap_keys(keys: Keys, raw_meta: dict[Any, Any]) -> list[str]:
    """:func:`filter_keys` of the filter's meta hash as read (HGETALL)."""
    found = BloomFilter(1, 0.5)
    meta = {_s(k): _s(v) for k, v in raw_meta.items()}
    if "period" in meta:
        return slice_keys(keys, meta)
    return found.all_keys(keys, found.layers) if found.learn(meta) else []


async def filter_metas(client: Any, keys: Keys) -> tuple[dict[Any, Any], dict[Any, Any]]:
    """The meta hashes of the crawl's Bloom filter and of its exact set's buckets, as read
    (HGETALL), in one round trip."""
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.bloom)
    pipe.hgetall(keys.buckets)
    bloom, buckets = await pipe.execute()
    return bloom, buckets


def slice_keys(keys: Keys, meta: dict[str, str]) -> list[str]:
    """The bitmaps of every layer of each time slice a meta hash (decoded) holds."""
    capacity, k, part = meta_layout(meta)
    names = []
    for i in range(SEEN_SLICES + 1):
        for j in range(meta_layers(meta, f"l{i}")):
            parts = layer_parts(capacity, k, part, j)
            names += [f"{keys.bloom}:s{i}:{j}:{p}" for p in range(parts)]
    return names
