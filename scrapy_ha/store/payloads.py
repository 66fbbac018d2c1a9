"""What the operator's tools read of stored requests (``dlq``, ``delayed``, ``report``, the
dashboard, the demo): payloads as documents, expanded with the crawl's dictionaries when
they are compacted (:mod:`scrapy_ha.store.dictionary`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy_ha.codec.compact import dictionary_id, expand
from scrapy_ha.store.dictionary import Dictionaries

if TYPE_CHECKING:
    from collections.abc import Sequence

    from scrapy_ha.keys import Keys

__all__ = ["read_payload_sync", "read_payloads"]


async def read_payloads(client: Any, keys: Keys, ids: Sequence[str | bytes]) -> list[bytes | None]:
    """The payloads of entries *ids* (leased, delayed or dead) as documents: expanded when
    compacted (a frame whose dictionary is gone is returned as it is: readers that rebuild
    or describe it report it unreadable)."""
    if not ids:
        return []
    raw = await client.hmget(keys.payload, list(ids))
    dictionaries = Dictionaries(client, keys)
    await dictionaries.ensure(p for p in raw if p is not None)
    return [None if p is None else _expanded(dictionaries, p) for p in raw]


def _expanded(dictionaries: Dictionaries, payload: bytes) -> bytes:
    try:
        return dictionaries.expand(payload)
    except ValueError:  # CodecError: unreadable, shown as such by whoever describes it
        return payload


def read_payload_sync(client: Any, keys: Keys, entry_id: str) -> bytes | None:
    """:func:`read_payloads` of one entry with a synchronous client."""
    payload: bytes | None = client.hget(keys.payload, entry_id)
    dict_id = None if payload is None else dictionary_id(payload)
    if payload is None or dict_id is None:
        return payload
    data = client.hget(keys.dictionaries, str(dict_id))
    try:
        return expand(payload, {} if data is None else {dict_id: data})
    except ValueError:
        return payload
