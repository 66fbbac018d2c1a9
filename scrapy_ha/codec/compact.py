"""The compact form of a stored request: its document deflated with a dictionary of the
crawl's own requests (zlib's preset dictionary), about a sixth of its size.

A realistic request (``{"v":1,"u":"https://www.example-shop-N.com/catalogue/category/
books_M/item-K/index.html?ref=list","cb":"parse_item"}``, 124 bytes) takes 23 bytes
compacted: the dictionary holds the crawl's URL prefixes and field names, and what is left
is the numbers. A compacted payload is a frame: ``\\x02``, the id of its dictionary (one
byte, 1 to 255), two bytes of the dictionary's CRC-32 (:attr:`Dictionary.tag`), then raw
deflate data. Raw deflate holds no check: a frame expanded with another dictionary than
its own gives another request, often as well-formed (a QA run: a crawl's dictionary
deleted by hand, a worker trained another under the same id, and the workers crawled one
another's requests as other URLs, silently). The tag makes that an error, but for one pair
of dictionaries in 65,536. A frame of an
earlier version, ``\\x01`` and the id then the data, has no tag and is read as it is; one
is written with an earlier version's dictionary, for its workers to read.
Anything else is a plain document (``{...}``), as stored before, and read as it is: a
crawl holds both forms.

Reading a frame is bounded like reading a document: its output never grows past
``MAX_PAYLOAD_BYTES``, whatever the frame holds (a deflate bomb written into Redis costs the
reader that much and no more).
"""

from __future__ import annotations

import functools
import zlib
from typing import TYPE_CHECKING

from scrapy_ha.codec.document import MAX_PAYLOAD_BYTES, CodecError

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = [
    "DICTIONARY_BYTES",
    "FRAME",
    "SAMPLE_MAX_BYTES",
    "UNTAGGED_FRAME",
    "Dictionary",
    "dictionary_id",
    "expand",
    "fresh_id",
    "parse_id",
    "tag",
    "train",
]

#: The first byte of a compacted payload (a document starts with ``{``), with its
#: dictionary's tag (:attr:`Dictionary.tag`).
FRAME = 0x02
#: The first byte of a frame of an earlier version: no tag.
UNTAGGED_FRAME = 0x01
#: The size of a crawl's dictionary: 2 KB of its requests compacts a realistic request to
#: 21 bytes, 4 KB to 20, 512 bytes to 23 (measured on 5,000 shop URLs of 10,000 hosts; a
#: frame's tag adds 2).
DICTIONARY_BYTES = 2048
#: Deflate's window: 4 KB, room for the dictionary and a request behind it (negative: raw
#: deflate, no header or checksum: the frame is the header).
WBITS = -12
#: zlib's memory level: 4 keeps a compressor's state small (its copy costs 4 µs a request;
#: 8, zlib's default, compacts no smaller and copies slower).
MEM_LEVEL = 4
#: zlib's compression level (6, its default: 9 compacts these short texts no smaller).
LEVEL = 6
#: Requests larger than this are not taken as samples: a page's HTML passed in meta would
#: fill the dictionary with one request.
SAMPLE_MAX_BYTES = 512


class Dictionary:
    """A crawl's dictionary (*data*) under its *id*: compacts requests into frames, tagged
    unless *tagged* is False (frames of an earlier version, which its workers read)."""

    def __init__(self, dict_id: int, data: bytes, *, tagged: bool = True) -> None:
        if not 1 <= dict_id <= 255:
            raise ValueError(f"a dictionary id is 1 to 255, not {dict_id}")
        self.id = dict_id
        self.data = data
        self.tag = tag(data)
        self._head = (
            bytes((FRAME, dict_id)) + self.tag if tagged else bytes((UNTAGGED_FRAME, dict_id))
        )
        self._primed = zlib.compressobj(
            LEVEL, zlib.DEFLATED, WBITS, MEM_LEVEL, zlib.Z_DEFAULT_STRATEGY, data
        )

    def compact(self, payload: bytes) -> bytes:
        """*payload* as a frame, or as it is when the frame would not be smaller."""
        deflate = self._primed.copy()
        frame = self._head + deflate.compress(payload) + deflate.flush()
        return frame if len(frame) < len(payload) else payload


@functools.lru_cache(maxsize=16)  # (a bytes object keeps its hash: a lookup is cheap)
def tag(data: bytes) -> bytes:
    """What a frame holds of its dictionary *data*: two bytes of its CRC-32."""
    return (zlib.crc32(data) & 0xFFFF).to_bytes(2, "big")


def fresh_id(data: bytes, taken: set[int]) -> int | None:
    """The id for a new dictionary *data*: one of 2 to 255 from its CRC-32 (two workers
    that train the same take the same), the next one not *taken* (None: all are)."""
    start = (zlib.crc32(data) >> 16) % 254
    for step in range(254):
        dict_id = 2 + (start + step) % 254
        if dict_id not in taken:
            return dict_id
    return None


def parse_id(value: bytes | str | None) -> int | None:
    """The dictionary id *value* names (a field of the crawl's dictionaries key, or its
    ``current``): a canonical number of 1 to 255; None for anything else (written by
    hand)."""
    found = value.decode("latin-1") if isinstance(value, bytes) else str(value)
    if found.isascii() and found.isdigit() and found == str(int(found)) and int(found) <= 255:
        return int(found) or None
    return None


def dictionary_id(stored: bytes) -> int | None:
    """The id of the dictionary a stored payload was compacted with (None: a document)."""
    if len(stored) >= 2 and (stored[0] == FRAME or stored[0] == UNTAGGED_FRAME):
        return stored[1]
    return None


def expand(stored: bytes, dictionaries: Mapping[int, bytes]) -> bytes:
    """The document of a stored payload: a frame expanded with its dictionary of
    *dictionaries* (id -> data), anything else as it is. Raise :class:`CodecError` for a
    frame whose dictionary is not given, that does not expand, or that expands past
    ``MAX_PAYLOAD_BYTES``."""
    dict_id = dictionary_id(stored)
    if dict_id is None:
        return stored
    data = dictionaries.get(dict_id)
    if data is None:
        raise CodecError(
            f"the request was compacted with dictionary {dict_id}, which is gone from the "
            f"crawl's dictionaries (a worker holding it writes it back within 10 s; else "
            f"restore it from a copy): `scrapy-ha dlq requeue <spider> --class corrupt` "
            f"then brings such requests back"
        )
    start = 2
    if stored[0] == FRAME:
        start = 4
        if stored[2:4] != tag(data):
            raise CodecError(
                f"the request was compacted with another dictionary than the crawl's "
                f"dictionary {dict_id} (its key was deleted or lost, and another trained)"
            )
    inflate = zlib.decompressobj(WBITS, data)
    try:
        document = inflate.decompress(stored[start:], MAX_PAYLOAD_BYTES + 1)
    except zlib.error as exc:
        raise CodecError(f"the compacted request cannot be read: {exc}") from None
    if len(document) > MAX_PAYLOAD_BYTES or inflate.unconsumed_tail:
        raise CodecError(f"the compacted request expands past {MAX_PAYLOAD_BYTES} bytes")
    return document


def train(samples: Iterable[bytes], size: int = DICTIONARY_BYTES) -> bytes:
    """A dictionary of at most *size* bytes from the requests *samples* (documents): the
    last of them whole, most recent last (deflate finds the nearest match first), each
    taken once and none larger than ``SAMPLE_MAX_BYTES``."""
    picked: list[bytes] = []
    seen: set[bytes] = set()
    total = 0
    for sample in reversed(list(samples)):
        if sample in seen or len(sample) > SAMPLE_MAX_BYTES or dictionary_id(sample) is not None:
            continue
        if total + len(sample) > size:
            break
        seen.add(sample)
        picked.append(sample)
        total += len(sample)
    return b"".join(reversed(picked))
