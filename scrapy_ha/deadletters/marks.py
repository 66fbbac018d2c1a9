"""Which dead letters each SQL archive holds, recorded in Redis next to the queue.

``Keys.dead_archived`` holds, per entry id, ``"<dead-letter time of the copy> <sink id>
..."``: the version copied and every archive (a *sink*) that holds it, marked by one script
(``store/lua/archived.lua``). A sink is a database (where it is and its name, never who
logs in or how) and a table, named in Redis by :func:`sink_id`, with a field
``~sink:<id>`` that says what it names. So copying to a second database copies everything
it lacks, whatever the first one holds. Once an archive is declared for a crawl (field
``~archive``), retention and ``dlq purge`` drop only entries some archive holds at their
current version, so nothing leaves Redis unrecorded.
"""

from __future__ import annotations

__all__ = [
    "ARCHIVE_MARK",
    "SINK_MARK",
    "declare",
    "declared",
    "durable_url",
    "forget_gone",
    "holds",
    "kept_by_purge",
    "mark",
    "mark_crawl",
    "parts",
    "sink_id",
    "sink_name",
    "spread_declaration",
    "unarchived",
]

import functools
import hashlib
import os
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from scrapy_ha.config.validate import ConfigError
from scrapy_ha.deadletters.dlq import SCAN_BATCH, DeadEntry, DeadLetterQueue
from scrapy_ha.deadletters.sharded import ShardedDeadLetters
from scrapy_ha.store import scripts
from scrapy_ha.store.join import ARCHIVE_MARK  # (the field that declares an archive)
from scrapy_ha.store.sharding import shards_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from redis.asyncio import Redis

    from scrapy_ha.keys import Keys
    from scrapy_ha.store.queue import RedisQueue

#: ``Keys.dead_archived`` field ``~sink:<sink id>`` -> the sink it names (no credentials).
SINK_MARK = "~sink:"
#: Hex digits of a sink id: a few sinks per crawl, and every entry's field names those that
#: hold it, so short (2^-32 odds that two sinks of one crawl share an id).
SINK_ID_DIGITS = 8
#: Query parameters that say which database a URL reaches (libpq's ``host=/run/...`` for a
#: Unix socket); the others (``password``, ``sslmode``, ``application_name`` ...) say how to
#: connect or as whom, and the same database reached otherwise is the same sink.
WHERE_PARAMS = frozenset({"host", "hostaddr", "port", "dbname", "service", "database"})


class Sink(Protocol):
    """What Redis records of an archive (:class:`scrapy_ha.deadletters.archive.Archive`)."""

    display_url: str
    sink: str
    sink_name: str


def sink_name(url: Any, table: str) -> str:
    """Which database and table *url* (a SQLAlchemy URL) and *table* name, without who logs
    in or how: ``postgresql://db.example:5432/crawls?host=... table t``; a SQLite file by
    its absolute path."""
    database = url.database or ""
    if url.get_backend_name() == "sqlite" and database and database != ":memory:":
        database = os.path.abspath(database)
    where = "&".join(f"{k}={v}" for k, v in sorted(url.query.items()) if k.lower() in WHERE_PARAMS)
    host = (url.host or "").lower() + (f":{url.port}" if url.port else "")
    query = f"?{where}" if where else ""
    return f"{url.get_backend_name()}://{host}/{database}{query} table {table}"


def sink_id(name: str) -> str:
    """The short name of a sink in Redis (:data:`SINK_ID_DIGITS` hex digits of its SHA-256)."""
    return hashlib.sha256(name.encode()).hexdigest()[:SINK_ID_DIGITS]


async def declare(client: Redis, keys: Keys, archive: Sink) -> None:
    """Record in Redis that *keys*' crawl has an archive: from now on, retention and purge
    keep the entries not archived yet. The sink's id is recorded with what it names."""
    await client.hset(
        keys.dead_archived,
        mapping={ARCHIVE_MARK: archive.display_url, SINK_MARK + archive.sink: archive.sink_name},
    )


async def spread_declaration(queue: RedisQueue) -> None:
    """Declare in every shard of *queue*'s crawl the archive a shard of it declares: a
    finished crawl run again with more shards has new shards without it, whose retention
    and ``dlq purge`` would drop for good the entries no archive holds."""
    shards = shards_of(queue)
    found = [await s.client.hget(s.keys.dead_archived, ARCHIVE_MARK) for s in shards]
    url = next((u for u in found if u is not None), None)
    for shard, there in zip(shards, found, strict=True):
        if url is not None and there is None:
            await shard.client.hsetnx(shard.keys.dead_archived, ARCHIVE_MARK, url)


async def declared(client: Redis, keys: Keys) -> str | None:
    """The archive declared for the crawl (its URL, secrets masked), if any."""
    url = await client.hget(keys.dead_archived, ARCHIVE_MARK)
    return url.decode() if isinstance(url, bytes) else url


async def kept_by_purge(dlq: DeadLetterQueue, entries: list[DeadEntry]) -> list[DeadEntry]:
    """Of *entries*, those ``dlq purge`` keeps: their shard declares an SQL archive and no
    archive holds the version in the queue (``lib/deadletter.lua``'s ``archived``), for a
    dry run to count what the purge would do (a QA run: it named every entry)."""
    sharded = dlq if isinstance(dlq, ShardedDeadLetters) else None
    groups: dict[int, list[tuple[DeadEntry, str]]] = {}
    for entry in entries:
        shard, local = sharded.sharded.route(entry.id) if sharded else (0, entry.id)
        groups.setdefault(shard, []).append((entry, local))
    kept = []
    for shard, pairs in groups.items():
        part = sharded.parts[shard] if sharded else dlq
        if not await part.client.hexists(part.keys.dead_archived, ARCHIVE_MARK):
            continue  # no archive: every one goes
        for i in range(0, len(pairs), SCAN_BATCH):
            chunk = pairs[i : i + SCAN_BATCH]
            marks = await part.client.hmget(part.keys.dead_archived, [lid for _, lid in chunk])
            kept += [e for (e, _), m in zip(chunk, marks, strict=True) if _version(m) != e.dead_at]
    return kept


def _version(mark: bytes | str | None) -> int | None:
    """The dead-letter time an entry's archive mark names (None: no mark)."""
    if mark is None:
        return None
    head = (mark.decode() if isinstance(mark, bytes) else mark).split(" ", 1)[0]
    return int(head) if head.lstrip("-").isdigit() else None


async def unarchived(dlq: DeadLetterQueue, sink: str) -> AsyncIterator[list[DeadEntry]]:
    """The entries whose current version the archive *sink* (a :func:`sink_id`) does not
    hold, in batches, oldest first."""
    batch: list[DeadEntry] = []
    async for entry in dlq.scan():
        batch.append(entry)
        if len(batch) >= SCAN_BATCH:
            yield await _not_archived(dlq, batch, sink)
            batch = []
    if batch:
        yield await _not_archived(dlq, batch, sink)


async def _not_archived(
    dlq: DeadLetterQueue, entries: list[DeadEntry], sink: str
) -> list[DeadEntry]:
    marks = await dlq.client.hmget(dlq.keys.dead_archived, [e.id for e in entries])
    return [e for e, m in zip(entries, marks, strict=True) if not holds(m, sink, e.dead_at)]


def holds(mark: bytes | str | None, sink: str, version: int) -> bool:
    """Whether an entry's mark says *sink* holds its *version* (a bare time, written before
    sinks were told apart, names none: each sink copies that entry once more, an upsert)."""
    if mark is None:
        return False
    at, *sinks = (mark.decode() if isinstance(mark, bytes) else mark).split()
    return int(at) == version and sink in sinks


async def mark(client: Redis, keys: Keys, sink: str, entries: list[DeadEntry]) -> None:
    """Record that the archive *sink* holds these versions of *entries* (one script: a
    worker and the command may mark the same entry for two sinks at once)."""
    if entries:
        pairs = [str(x) for e in entries for x in (e.id, e.dead_at)]
        await client.eval(scripts.ARCHIVED_LUA, 1, keys.dead_archived, sink, *pairs)


def parts(dlq: DeadLetterQueue) -> list[tuple[DeadLetterQueue, Callable[[str], str]]]:
    """The dead-letter queue of each shard of *dlq*'s crawl (itself when it is not
    sharded), each with what names its ids as the crawl's queue does (``"<shard>:<id>"``)."""
    if not isinstance(dlq, ShardedDeadLetters):
        return [(dlq, str)]
    outside = dlq.sharded.outside
    return [(part, functools.partial(outside, i)) for i, part in enumerate(dlq.parts)]


async def mark_crawl(dlq: DeadLetterQueue, sink: str, entries: list[DeadEntry]) -> None:
    """:func:`mark` *entries* (named as *dlq* names them), each in its shard."""
    if not isinstance(dlq, ShardedDeadLetters):
        await mark(dlq.client, dlq.keys, sink, entries)
        return
    by: dict[int, list[DeadEntry]] = {}
    for entry in entries:
        shard, local = dlq.sharded.route(entry.id)
        by.setdefault(shard, []).append(replace(entry, id=local))
    for shard, some in sorted(by.items()):
        await mark(dlq.parts[shard].client, dlq.parts[shard].keys, sink, some)


async def forget_gone(client: Redis, keys: Keys) -> int:
    """Drop the marks of entries no longer dead (requeued, then acked); return how many."""
    fields = [
        f.decode() if isinstance(f, bytes) else str(f)
        for f in await client.hkeys(keys.dead_archived)
    ]
    fields = [f for f in fields if not f.startswith("~")]  # the archive's and sinks' marks
    gone = []
    for i in range(0, len(fields), SCAN_BATCH):
        chunk = fields[i : i + SCAN_BATCH]
        scores = await client.zmscore(keys.dead, chunk)
        gone += [f for f, score in zip(chunk, scores, strict=True) if score is None]
    if gone:
        await client.hdel(keys.dead_archived, *gone)
    return len(gone)


def durable_url(sa: Any, url: str, what: str) -> str:
    """*url* with a SQLite file named by its absolute path (consumers and workers started in
    different directories write one file, and a sink's name says which). A SQLite database
    in memory (``sqlite://``, ``sqlite:///:memory:``) is refused, *what* named: what was
    stored in it (and so taken out of Redis) would be gone when the process exits. A URL
    SQLAlchemy would read otherwise than meant is refused too: a port that is not a number,
    an '@' in the host (a password's own '@', unencoded: the driver would show the rest of
    the password as the host it cannot resolve)."""
    try:
        parsed = sa.engine.make_url(url)
    except ValueError:  # (its message would echo the text read as a port)
        raise ConfigError(
            f"{what}: its port is not a number (percent-encode ':', '@' and '/' in a password)"
        ) from None
    if "@" in (parsed.host or ""):
        raise ConfigError(f"{what}: its host holds an '@': percent-encode '@' in a password (%40)")
    if parsed.get_backend_name() != "sqlite":
        return url
    database = parsed.database or ""
    if database in ("", ":memory:") or database.startswith("file::memory:"):
        raise ConfigError(
            f"{what}: a SQLite database in memory loses everything stored in it when the "
            f"process exits: name a file (sqlite:///items.db)"
        )
    if database.startswith("file:") or os.path.isabs(database):
        return url
    return str(parsed.set(database=os.path.abspath(database)).render_as_string(False))
