"""The exact dupefilter in buckets (``HA_DUPEFILTER = "set"``, the default), as the scripts
that enqueue are told of it (``lua/lib/seen.lua``).

One set of 12-byte fingerprints costs Redis about 57 bytes a URL at a million and 68 at
ten million (a hash table entry each). Split by the fingerprint into buckets of at most
512 integers, each set is an *intset* (``set-max-intset-entries``): 8 bytes a URL. The
bucket of a fingerprint is its bytes 9-12 modulo the bucket count, its member bytes 1-8 as
a signed 64-bit integer; Lua 5.1 has no 64-bit integer, so the worker sends the four bytes
raw and the member in decimal (:func:`wire_fingerprint`). Two URLs are taken for one when
their 64 + log2(buckets) >= 76 bits agree: at a billion URLs in 2^22 buckets (the count
for that capacity), odds of about 1e-8 that any two do.

The bucket count comes from ``HA_DUPEFILTER_CAPACITY`` (:func:`bucket_count`) and is stored
with the crawl, in the meta hash, when its first URL is added: every worker, the CLI and a
later run use the stored count, whatever their setting. A crawl that outgrows it stays
exact; its buckets past 512 members become hash tables (the single set's cost again), and
the status says so (:attr:`BucketState.over`).

A crawl whose dupefilter is the single set of a version before the buckets keeps it
(:class:`~scrapy_ha.store.bloom.ExactSet`): it is read and written as it was made.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_ha.keys import FINGERPRINT_BYTES
from scrapy_ha.store import scripts
from scrapy_ha.store.bloom import BLOOM_FINGERPRINT_BYTES, Dupefilter
from scrapy_ha.store.wire import text as _s

if TYPE_CHECKING:
    from scrapy_ha.keys import Keys

__all__ = [
    "BUCKET_FILL",
    "MIN_BUCKETS",
    "BucketSet",
    "BucketState",
    "bucket_count",
    "bucket_of",
    "bucket_state",
    "delete_buckets",
    "member_of",
    "read_buckets",
    "wire_fingerprint",
]

#: Fingerprints a bucket holds at the crawl's capacity, at most: a bucket's count varies
#: about its mean (Poisson, sd ~20 at 384), and the fullest of a million buckets stays
#: under Redis's 512 intset entries (mean + 6 sd) while the mean is at most this.
BUCKET_FILL = 384
#: The fewest buckets: 2^12, so that a fingerprint keeps 64 + 12 = 76 bits.
MIN_BUCKETS = 4096
#: Buckets a flush or a finish deletes per call (lua/drop_buckets.lua): about 3.5 ms of
#: Redis's time a call, 5 ms when every bucket holds 384 fingerprints (a bucket's name costs
#: more than its intset: 32,768 names cost 13.5 ms none made, 19.5 ms all made and full).
#: The default capacity's 32,768 buckets go in 4 calls, a billion URLs' 4 M in 512.
DELETE_BATCH = 8192


def bucket_count(capacity: int) -> int:
    """The buckets of a crawl of *capacity* URLs: the least power of two, at least
    :data:`MIN_BUCKETS`, that keeps each at most :data:`BUCKET_FILL` at capacity."""
    count = MIN_BUCKETS
    while count * BUCKET_FILL < capacity:
        count *= 2
    return count


def sized(fingerprint: bytes, size: int) -> bytes:
    """A request's fingerprint as the dupefilter is sent it: its first *size* bytes; for a
    Bloom filter, a fingerprint shorter than its 16 (a project's
    ``REQUEST_FINGERPRINTER_CLASS``) is replaced by the first 16 of its SHA-1, so that both
    48-bit hashes its positions are made of are random (a short one left them 0 or
    repeated: most new URLs taken for seen). The exact set does the same with its 12
    (:func:`twelve`), where the scripts read it."""
    if size != BLOOM_FINGERPRINT_BYTES or len(fingerprint) >= size:
        return fingerprint[:size]
    return hashlib.sha1(fingerprint).digest()[:size]  # noqa: S324 (not a secret)


def twelve(fingerprint: bytes) -> bytes:
    """The 12 bytes a bucket and its member are read from: a fingerprint's first 12 (as a
    worker cuts it), or, for a shorter one (a project's ``REQUEST_FINGERPRINTER_CLASS``),
    the first 12 of its SHA-1, so that two fingerprints of any length are told apart."""
    if len(fingerprint) >= FINGERPRINT_BYTES:
        return fingerprint[:FINGERPRINT_BYTES]
    return hashlib.sha1(fingerprint).digest()[:FINGERPRINT_BYTES]  # noqa: S324 (not a secret)


def bucket_of(fingerprint: bytes, buckets: int) -> int:
    """The bucket of a fingerprint: bytes 9-12 of :func:`twelve` modulo the count (bytes
    1-4 place it on a shard, so they would fill a shard's buckets unevenly)."""
    return int.from_bytes(twelve(fingerprint)[8:12], "big") % buckets


def member_of(fingerprint: bytes) -> int:
    """The member of a fingerprint in its bucket: bytes 1-8 of :func:`twelve`, a signed
    64-bit integer."""
    return int.from_bytes(twelve(fingerprint)[:8], "big", signed=True)


def wire_fingerprint(fingerprint: bytes) -> bytes:
    """A fingerprint as the scripts take it: bytes 9-12 of :func:`twelve` raw, then the
    member in decimal (at least 5 bytes)."""
    if not fingerprint:
        return fingerprint
    whole = twelve(fingerprint)  # (member_of's bytes, cut once: a call per stored request)
    return whole[8:12] + b"%d" % int.from_bytes(whole[:8], "big", signed=True)


@dataclass
class BucketSet(Dupefilter):
    """The exact set in buckets; *buckets*: the count of a crawl made now, or the stored."""

    buckets: int

    def key(self, keys: Keys) -> str:
        return keys.buckets

    def extra_keys(self, keys: Keys, new: int = 0) -> list[str]:  # noqa: ARG002
        # read only, so that buckets are never made beside time slices another worker made
        # (lua/lib/seen.lua's rule, one kind)
        return [keys.aged]

    def spec(self, new: int = 0) -> str:  # noqa: ARG002
        return f"buckets {self.buckets}"

    def wire(self, fingerprint: bytes) -> bytes:
        return wire_fingerprint(fingerprint)


@dataclass(frozen=True)
class BucketState:
    """The exact set's buckets as stored: what ``scrapy-ha status`` and the metrics show."""

    buckets: int
    gen: str
    #: fingerprints held
    urls: int

    @property
    def capacity(self) -> int:
        """URLs the buckets hold before some pass 512 members and cost 8x as much."""
        return self.buckets * BUCKET_FILL

    @property
    def over(self) -> bool:
        return self.urls > self.capacity

    def key(self, keys: Keys, bucket: int) -> str:
        return f"{keys.buckets}:{self.gen}:{bucket}"


def bucket_state(meta: dict[Any, Any]) -> BucketState | None:
    """The buckets a meta hash (read with HGETALL) describes; None when there are none."""
    fields = {_s(k): _s(v) for k, v in meta.items()}
    if "buckets" not in fields or "gen" not in fields:
        return None
    return BucketState(int(fields["buckets"]), fields["gen"], int(fields.get("n", 0)))


async def read_buckets(client: Any, keys: Keys) -> BucketState | None:
    """The crawl's buckets as stored (None: the crawl has none)."""
    return bucket_state(await client.hgetall(keys.buckets))


async def delete_buckets(
    client: Any, state: BucketState | None, keys: Keys, *, every: bool = False
) -> None:
    """Delete the buckets of *state*, :data:`DELETE_BATCH` keys a call (their meta hash has
    gone, or goes, by other means: a crawl made again has another ``gen``). With *every*
    (a flush), also any other bucket under the crawl's prefix, found by SCAN: those of a
    finish that stopped before it deleted them."""
    if state:  # named in Redis (lua/drop_buckets.lua): a billion-URL crawl has 4 M of them
        drop = client.register_script(scripts.DROP_BUCKETS_LUA)
        for first in range(0, state.buckets, DELETE_BATCH):
            last = min(first + DELETE_BATCH, state.buckets) - 1
            await drop(keys=[keys.buckets, keys.queues], args=[state.gen, first, last])
    if every:
        pattern = "".join(f"\\{c}" if c in "\\*?[]" else c for c in keys.buckets) + ":*"
        # (the names as Redis gave them: one not UTF-8, escaped, would name another key)
        names = [key async for key in client.scan_iter(match=pattern, count=10_000)]
        for i in range(0, len(names), DELETE_BATCH):
            await client.unlink(*names[i : i + DELETE_BATCH])
