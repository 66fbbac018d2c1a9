"""The crawl's dupefilter as ``scrapy-ha status`` shows it: a Bloom filter's layers and
error, or the exact set's buckets and whether the crawl outgrew them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scrapy_ha.store.bloom_state import BloomState
    from scrapy_ha.store.buckets import BucketState

__all__ = ["buckets_lines", "dupefilter_json", "dupefilter_line"]


def dupefilter_json(blooms: list[BloomState], buckets: list[BucketState]) -> dict[str, Any]:
    if not blooms:
        return {"kind": "set", **_buckets_json(buckets)}
    return {
        "kind": "bloom",
        "urls": sum(b.urls for b in blooms),
        "layers": max(len(b.added) for b in blooms),
        "slices": max(b.slices for b in blooms),
        "bytes": sum(b.bytes for b in blooms),
        "error_now": max(b.error_now for b in blooms),
        "error_bound": blooms[0].bound,
        "error_asked": blooms[0].asked,
        "expected_false_positives": sum(b.expected_false_positives for b in blooms),
    }


def dupefilter_line(blooms: list[BloomState]) -> str:
    """The Bloom filter of the crawl, every shard's summed as :func:`dupefilter_json` sums
    them (the URLs, the bytes, the URLs expected lost; the worst error and layer count),
    and its time slices (``HA_DUPEFILTER_TTL``)."""
    d = dupefilter_json(blooms, [])
    per_url = d["bytes"] / d["urls"] if d["urls"] else 0.0
    layers = f"{d['layers']} layer(s)"
    if len(blooms) > 1:
        layers = f"{len(blooms)} shards of at most {layers}"
    if d["slices"]:  # HA_DUPEFILTER_TTL: the URLs the live time slices hold
        layers += f" of {d['slices']} time slice(s)"
    return (
        f"{'dupefilter':>13}  bloom: {d['urls']:,} URLs in {layers}, "
        f"{d['bytes'] / 2**20:,.1f} MB ({per_url:.1f} bytes a URL); error now "
        f"{d['error_now']:.1e}, at most {d['error_bound']:.1e} (asked {d['error_asked']:g}); "
        f"about {d['expected_false_positives']:,.1f} URL(s) never crawled (expected)"
    )


def _buckets_json(buckets: list[BucketState]) -> dict[str, Any]:
    if not buckets:
        return {}
    return {
        "urls": sum(b.urls for b in buckets),
        "buckets": sum(b.buckets for b in buckets),
        "capacity": sum(b.capacity for b in buckets),
        "over_capacity": any(b.over for b in buckets),
    }


def buckets_lines(buckets: list[BucketState]) -> list[str]:
    """A line when a shard's exact set holds more than its buckets were made for."""
    over = [b for b in buckets if b.over]
    if not over:
        return []
    urls, capacity = sum(b.urls for b in buckets), sum(b.capacity for b in buckets)
    return [
        f"{'dupefilter':>13}  set: {urls:,} URLs, past the {capacity:,} its buckets were made "
        "for: fuller buckets cost about 8 times the memory a URL (a crawl made again with a "
        "larger HA_DUPEFILTER_CAPACITY gets more buckets)"
    ]
