"""Reading and writing a crawl's back queues as raw Redis data (tests that look at or plant
pending requests the way another Redis client would; see scrapy_ha/store/lua/lib/frontier.lua
for the form)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scrapy_ha.keys import Keys


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def split(element: bytes) -> tuple[bytes, bytes]:
    """(entry id, payload) of an element (``"<id> <payload>"`` or ``"<id>@<place> ..."``)."""
    head, _, payload = element.partition(b" ")
    return head.partition(b"@")[0], payload


def qids(client: Any, keys: Keys) -> list[str]:
    """The back queues that hold requests (ready, then waiting)."""
    found = client.zrange(keys.ready, 0, -1) + client.zrange(keys.waiting, 0, -1)
    return [_text(q) for q in found]


def pending(client: Any, keys: Keys) -> list[tuple[bytes, bytes]]:
    """Every pending (entry id, payload), queue by queue, each queue in its order."""
    return [split(e) for q in qids(client, keys) for e in client.lrange(keys.queue(q), 0, -1)]


async def pending_async(client: Any, keys: Keys) -> list[tuple[bytes, bytes]]:
    """:func:`pending` with a redis.asyncio client."""
    found = await client.zrange(keys.ready, 0, -1) + await client.zrange(keys.waiting, 0, -1)
    out = []
    for q in found:
        out += [split(e) for e in await client.lrange(keys.queue(_text(q)), 0, -1)]
    return out


def plant(client: Any, keys: Keys, entries: list[tuple[str, bytes]], qid: str = "0:-") -> None:
    """Put (entry id, payload) entries as pending requests of back queue *qid*, as a Redis
    writer would (an entry that comes back: its place is written, in the given order)."""
    for place, (entry_id, payload) in enumerate(entries, 1):
        client.rpush(keys.queue(qid), f"{entry_id}@{place} ".encode() + payload)
    client.zadd(keys.ready, {qid: 1}, nx=True)
    client.incrby(keys.queued, len(entries))


def count(client: Any, keys: Keys) -> int:
    """The number of pending requests (every back queue's length)."""
    return sum(client.llen(keys.queue(q)) for q in qids(client, keys))
