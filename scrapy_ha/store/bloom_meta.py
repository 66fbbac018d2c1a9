"""A Bloom filter's meta hash (``ha:{S}:bloom``) as read: each field through a checked
reader, so that a hash scrapy-ha cannot have written (a field missing where one is needed,
a count that is not a whole number, a rate that is not a finite number) is one
:class:`BloomMetaError` naming the field, never a ``ValueError`` of ``int()`` or
``float()`` out of a command."""

from __future__ import annotations

import math

__all__ = [
    "LAYOUT_FIELDS",
    "MAX_LAYERS",
    "BloomMetaError",
    "meta_count",
    "meta_layers",
    "meta_layout",
    "meta_rate",
]

#: The most layers a filter may have: layer i holds capacity * 2^i URLs, so the 64th would
#: hold more than any Redis could (a larger count in a meta hash is no filter's).
MAX_LAYERS = 64
#: The most bit positions per URL of a first layer (``MAX_K`` of ``lua/lib/bloom.lua``, whose
#: scripts refuse more): 1e-12 asked takes 41, a time slice's 44.
MAX_K = 60
#: The fields of a filter's meta hash that give its layout, each a whole number from 1.
LAYOUT_FIELDS = ("capacity", "k", "part")


class BloomMetaError(ValueError):
    """A Bloom filter's meta hash (``ha:{S}:bloom``) scrapy-ha cannot have written: a
    layout field missing, not a whole number, or 0 (a part of 0 bytes would never end a
    layer), a count (``n:<layer>``, ``s<slot>``) that is not a whole number, a rate
    (``error``, ``fp``) that is not a finite number, or a layout too large for any Redis.
    The operator's tools treat it as any unreadable state of a crawl: the
    exporter's ``scrapy_ha_crawl_read_error 1``, the dashboard's reason, a command's
    ``error:`` and exit code 2."""

    def __init__(self, why: str) -> None:
        super().__init__(
            f"unreadable Bloom filter meta: {why} (the hash ha:{{S}}:bloom holds whole numbers "
            "capacity, k and part from 1): restore or delete it"
        )


def meta_count(
    meta: dict[str, str],
    name: str,
    *,
    low: int = 0,
    high: int | None = None,
    missing: int | None = None,
) -> int:
    """Field *name* of a filter's meta hash (decoded), a whole number from *low* to *high*
    (*missing* when absent, if given); a BloomMetaError that names it if it is not."""
    text = meta.get(name)
    if text is None:
        if missing is not None:
            return missing
        raise BloomMetaError(f"no field {name!r}")
    if not (text.isascii() and text.isdecimal()) or int(text) < low:
        raise BloomMetaError(f"{name} is {text!r}, not a whole number of {low} or more")
    if high is not None and int(text) > high:
        raise BloomMetaError(f"{name} is {text}, more than {high}")
    return int(text)


def meta_layout(meta: dict[str, str]) -> tuple[int, int, int]:
    """(capacity, k, part) of a filter's meta hash (decoded), checked (:class:`BloomMetaError`)."""
    capacity, k, part = (meta_count(meta, name, low=1) for name in LAYOUT_FIELDS)
    if k > MAX_K:
        raise BloomMetaError(f"k is {k}, more than {MAX_K}")
    return capacity, k, part


def meta_layers(meta: dict[str, str], name: str) -> int:
    """A count of layers in a filter's meta hash (``layers``, or a slice's ``l<i>``): 0 when
    absent, at most MAX_LAYERS (a BloomMetaError beyond: no loop over a number no filter
    has)."""
    return meta_count(meta, name, high=MAX_LAYERS, missing=0)


def meta_rate(meta: dict[str, str], name: str, missing: float) -> float:
    """Field *name* of a filter's meta hash (decoded), a finite number of 0 or more (a rate,
    or false positives expected: ``error``, ``fp``); *missing* when absent; a
    BloomMetaError that names it if it is not."""
    text = meta.get(name)
    if text is None:
        return missing
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise BloomMetaError(f"{name} is {text!r}, not a finite number of 0 or more")
    return value
