"""The back queues of a crawl seen from Python (``lua/lib/frontier.lua`` keeps them): their
removal with the crawl, and the conversion of a crawl stored before them.

Before the back queues, every pending request was one member ``"<id> <payload>"`` of a
sorted set ``<prefix>:{<spider>}:pending``. A worker of this version that finds such a set
converts it at start (``convert.lua``, a batch per call, each request to the back queue of
its host and priority, in its place): the crawl goes on where it was. A worker of such a
version that runs beside them (a rolling upgrade) goes on storing there: this version
converts again at each reclaim and at the close of a finished spider.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy_ha.store import scripts
from scrapy_ha.store.script_keys import convert_keys

if TYPE_CHECKING:
    from scrapy_ha.keys import Keys

__all__ = ["CONVERT_BATCH", "convert_old_form", "flush_crawl"]

logger = logging.getLogger(__name__)

#: Requests converted per script call: a call holds Redis for a few milliseconds (about
#: 5 µs a request), and a million pending requests take 1,000 calls.
CONVERT_BATCH = 1000
#: Keys deleted per UNLINK command when a crawl is flushed.
DELETE_BATCH = 1000


def _raw(value: Any) -> bytes:
    """A key name or member as Redis holds it (bytes; a ``str`` from a decoding client)."""
    return value if isinstance(value, bytes) else str(value).encode()


def _glob_escape(text: str) -> str:
    return "".join(f"\\{c}" if c in "\\*?[]" else c for c in text)


async def convert_old_form(script: Any, keys: Keys, order: str) -> int:
    """Move the requests of *keys*' old pending sorted set into their back queues (*script*:
    ``convert.lua`` registered on the crawl's client; *order*: the crawl's order argument);
    return how many were moved. Several workers may run it at once: each call moves a batch
    atomically, and the last finds nothing left."""
    moved = 0
    while True:
        done, left = await script(keys=convert_keys(keys), args=[CONVERT_BATCH, order])
        moved += int(done)
        if not int(left) or not int(done):
            break
    if moved:
        logger.info(
            "Converted %d pending requests of %s stored by an older scrapy-ha (one sorted "
            "set) into their per-host queues",
            moved,
            keys.spider,
        )
    return moved


async def flush_crawl(client: Any, keys: Keys) -> None:
    """Delete every key of the crawl *keys* names but its checkpoints: the keys of
    :meth:`Keys.all`, its back queues (those ready and waiting name, and any other key
    under the back queues' prefix), every key under its Bloom filter's name, and the lease
    grants of its workers (which expire on their own: a QA run saw a crawl flushed while a
    killed worker's grant lived listed by the dashboard, which then said "no such crawl"
    of it). Names are taken as bytes, never
    decoded: one that is not UTF-8 (written by hand, or another program's) is deleted with
    the rest."""
    prefix = keys.queues.encode()
    names = {prefix + _raw(q) for q in await client.zrange(keys.ready, 0, -1)}
    names |= {prefix + _raw(q) for q in await client.zrange(keys.waiting, 0, -1)}
    # (a Bloom filter's bitmaps too, named from its meta hash: one that holds garbage
    # names none of them)
    heads = (prefix, keys.grant("").encode(), f"{keys.bloom}:".encode())
    common = keys.grant("").rsplit("grant:", 1)[0]  # the crawl's (its shard's) own tag
    async for key in client.scan_iter(match=_glob_escape(common) + "*", count=10_000):
        if _raw(key).startswith(heads):
            names.add(_raw(key))
    found = sorted(names)
    # UNLINK: Redis frees a large collection (100,000 delayed entries: 166 ms of DEL) in its
    # background thread, not while every worker of every crawl waits
    for i in range(0, len(found), DELETE_BATCH):
        await client.unlink(*found[i : i + DELETE_BATCH])
    await client.unlink(*keys.all(), relink_marker(keys))


#: Back queues relinked per call (``relink.lua``).
RELINK_BATCH = 1000
#: What a key set aside gets after its name (``<key>:corrupt:<seconds>``).
SET_ASIDE_MARK = b":corrupt:"


def relink_marker(keys: Keys) -> str:
    """The key that says a relink of the back queues is owed (``set_aside.lua`` writes it
    as it renames ``ready`` or ``waiting``; :func:`relink_queues` deletes it when done)."""
    return f"{keys.ready}:relink"


def relink_types(keys: Keys) -> dict[str, str]:
    """The types ``set_aside.lua`` is given for the keys of a relink: ``ready`` and
    ``waiting``, marked to write the marker when renamed, and the marker."""
    return {keys.ready: "zset!", keys.waiting: "zset!", relink_marker(keys): "marker"}


async def relink_queues(client: Any, keys: Keys, set_aside: list[str]) -> int:
    """If ``ready`` or ``waiting`` is among the keys just *set_aside* (garbage, a key of
    another type), or a relink is owed (a worker set one aside and stopped before its
    relink: the marker), make the back queues that neither names wait again, due now:
    their requests were out of every lease's reach (a QA run: 15 requests left in Redis,
    and the crawl finished). Workers call it at start, on a key of another type, and
    before a finish. Returns how many."""
    marker = relink_marker(keys)
    owed = await client.get(marker)  # (deleted at the end only if no rename came since)
    if keys.ready not in set_aside and keys.waiting not in set_aside and owed is None:
        return 0
    script = scripts.Registered(client, "relink")
    prefix = keys.queues.encode()
    found, moved = [], 0
    async for key in client.scan_iter(match=_glob_escape(keys.queues) + "*", count=10_000):
        name = _raw(key)
        if SET_ASIDE_MARK not in name:  # (a back queue set aside itself is not one)
            found.append(name[len(prefix) :])
    names, token = [keys.ready, keys.waiting, marker], b"" if owed is None else owed
    for i in range(0, max(len(found), 1), RELINK_BATCH):
        last = i + RELINK_BATCH >= len(found)
        args = [token if last else b"", *found[i : i + RELINK_BATCH]]
        moved += int(await script(keys=names, args=args))
    if moved:
        logger.warning(
            "%d back queue(s) of %s were named by no key (the one naming them was set aside): "
            "they are leased again",
            moved,
            keys.spider,
        )
    return moved
