"""The dashboard's tables: pages of a crawl's delayed entries and dead letters, read from
Redis by rank, of every shard of a sharded crawl.

Pages are read by rank in the sorted sets (``ZRANGE`` by index, the time window turned into
ranks with ``ZCOUNT``), never by loading a whole set: a page deep in a million entries costs
what the page costs. A filter on content (class, domain, status) scans on from where the
last page stopped, at most :data:`SCAN_LIMIT` entries per page, and says where to go on.
A sharded crawl's page merges the pages of its shards by time; its cursor holds where each
shard goes on. Stored requests are read with the codec's
:func:`~scrapy_ha.codec.describe`: data, never rebuilt, secrets masked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy_ha import metakeys
from scrapy_ha.codec import RequestSummary, describe
from scrapy_ha.codec.document import META
from scrapy_ha.codec.masking import mask_text, mask_url, mask_value
from scrapy_ha.dashboard._cursor import Entry, place, window, window_flat
from scrapy_ha.deadletters.dlq import DeadEntry, parse_entry
from scrapy_ha.ops.display import time_ms
from scrapy_ha.ops.waiting import HELD_KINDS
from scrapy_ha.store.payloads import read_payloads
from scrapy_ha.store.shard_sync import outside
from scrapy_ha.store.wire import text as _s

if TYPE_CHECKING:
    from scrapy_ha.keys import Keys

#: Entries read per round trip while a filtered page is filled (few round trips, each small).
BATCH = 1000
#: Ids read per round trip by an action on every entry of a time window.
ID_BATCH = 10_000
#: Entries a filtered page examines at most before it stops and offers "older": a page
#: with a rare filter answers within about a second, and the next page goes on from there.
SCAN_LIMIT = 5_000
#: A shard's place in a sharded crawl's cursor once it has nothing more to show.
DONE = "-"


@dataclass(frozen=True)
class Filter:
    """What a table shows: entries of this class, domain, HTTP status, time window (ms)."""

    failure_class: str | None = None
    domain: str | None = None
    status: int | None = None
    since_ms: int | None = None
    until_ms: int | None = None

    @property
    def by_content(self) -> bool:
        return any(v is not None for v in (self.failure_class, self.domain, self.status))

    def matches(self, row: Row) -> bool:
        return (
            (self.failure_class is None or row.failure_class == self.failure_class)
            and (self.domain is None or row.domain == self.domain.lower())
            and (self.status is None or row.status == self.status)
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "class": self.failure_class,
            "domain": self.domain,
            "status": self.status,
            "since": self.since_ms,
            "until": self.until_ms,
        }


@dataclass(frozen=True)
class Row:
    """One delayed entry or dead letter as a table shows it (URL, reason, history masked).

    A delayed entry that waits without an attempt has the class of why it waits: ``gate``
    (its domain's gate was closed) or ``limit`` (its domain's crawl-wide limits)."""

    id: str
    url: str
    failure_class: str
    status: int | None
    attempts: int
    #: Next try (delayed) or the time it was dead-lettered (dead), server ms.
    at_ms: int
    reason: str
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def domain(self) -> str:
        return (urlsplit(self.url).hostname or "").lower()

    @property
    def held(self) -> bool:
        return self.failure_class in HELD_KINDS

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "url": self.url,
            "class": self.failure_class,
            "status": self.status,
            "attempts": self.attempts,
            "at": self.at_ms,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Page:
    """A page of a table: its rows, how many entries the time window holds, and where to go
    on from (None: nothing older/later; a rank, or a sharded crawl's cursor)."""

    rows: list[Row]
    total: int
    next_cursor: str | None
    scanned: int
    #: where a page starting with each row starts (a sharded crawl's cursor names them)
    places: list[str] = field(default_factory=list)


def dead_row(entry: DeadEntry) -> Row:
    status = entry.info.get("status")
    return Row(
        id=entry.id,
        url=mask_url(entry.url),
        failure_class=entry.failure_class,
        status=status if isinstance(status, int) else None,
        attempts=entry.attempts,
        at_ms=entry.dead_at,
        reason=entry.reason,
        history=mask_value(_attempts(entry.info.get("history"))),
    )


def _attempts(history: Any) -> list[dict[str, Any]]:
    """A stored history's attempts (objects): one written by hand may be anything else."""
    return [h for h in history if isinstance(h, dict)] if isinstance(history, list) else []


#: Why a held entry waits, as its row says it (its domain and due time follow).
HELD_REASONS = {
    "gate": "its domain's gate is closed (a 429 asked every worker to wait)",
    "limit": "its domain is at its crawl-wide limit (HA_DOMAIN_CONCURRENCY, HA_DOMAIN_RATE)",
    "revisit": "a page revisited on a schedule (HA_REVISIT, meta ha_revisit): its next visit",
    "proxy": "no usable proxy when it was to go (HA_PROXY_*): it waits for one",
    "dictionary": "compacted with a dictionary the crawl's key lacks: it waits for a worker "
    "holding it to write it back",
}


def delayed_row(
    entry_id: str, due_ms: float, summary: RequestSummary, held: bytes | None = None
) -> Row:
    """A delayed entry: a retry has the class and reason of its last attempt; an entry that
    waits without an attempt says why (see :data:`HELD_REASONS`)."""
    meta = found if isinstance(found := summary.document.get(META), dict) else {}
    history = _attempts(meta.get(metakeys.HISTORY))
    last = history[-1] if history else {}
    retries = meta.get(metakeys.RETRIES)
    attempts = (
        sum(v for v in retries.values() if isinstance(v, int)) if isinstance(retries, dict) else 0
    )
    fclass = str(last.get("class") or "unknown")
    reason = mask_text(str(last.get("outcome") or ""))
    kind, _, _domain = _s(held or b"").partition(" ")
    if kind in HELD_REASONS:
        fclass, reason = kind, HELD_REASONS[kind]
    return Row(
        id=entry_id,
        url=mask_url(summary.url_or()),
        failure_class=fclass,
        status=None,
        attempts=attempts,
        at_ms=time_ms(due_ms),
        reason=reason,
        history=mask_value(history),
    )


def _may_match(flt: Filter, info: bytes | None, payload: bytes | None) -> bool:
    """A cheap first look: False only when the entry cannot match *flt* (its stored class or
    status differ, or its payload does not hold the domain); the row is checked in full."""
    if info is not None and (flt.failure_class is not None or flt.status is not None):
        try:
            doc = json.loads(info)
        except ValueError:
            return True
        if not isinstance(doc, dict):
            return True
        if flt.failure_class is not None and str(doc.get("class", "unknown")) != flt.failure_class:
            return False
        if flt.status is not None and doc.get("status") != flt.status:
            return False
    if payload is not None and flt.domain is not None and flt.domain.isascii():
        return flt.domain.lower().encode() in payload.lower()  # JSON escapes other hosts
    return True


class Tables:
    """Pages of the delayed and dead-letter sets of one crawl (of one shard of it)."""

    def __init__(self, client: Any, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    async def _rows(self, key: str, batch: list[Entry], flt: Filter) -> list[Row | None]:
        """The members of *batch* as rows, in its order; ``None`` for a member
        gone meanwhile or one a cheap look shows *flt* cannot match (the rest of it is then
        never read)."""
        ids = [entry.id for entry in batch]
        members = [entry.member for entry in batch]  # (an id not UTF-8 shows escaped)
        if not ids:
            return []
        if key == self.keys.delayed:
            payloads = await read_payloads(self.client, self.keys, members)
            wanted = [n for n, p in enumerate(payloads) if _may_match(flt, None, p)]
        else:
            infos = await self.client.hmget(self.keys.dead_info, members)
            wanted = [n for n, info in enumerate(infos) if _may_match(flt, info, None)]
        rows: list[Row | None] = [None] * len(ids)
        if not wanted:
            return rows
        if key == self.keys.delayed:
            marks = await self.client.hmget(self.keys.held, [members[n] for n in wanted])
            for n, mark in zip(wanted, marks, strict=True):
                rows[n] = delayed_row(ids[n], batch[n].score, describe(payloads[n]), mark)
            return rows
        payloads = await read_payloads(self.client, self.keys, [members[n] for n in wanted])
        for n, payload in zip(wanted, payloads, strict=True):
            if _may_match(flt, None, payload):
                rows[n] = dead_row(parse_entry(ids[n], batch[n].score, infos[n], payload))
        return rows

    async def page(
        self, key: str, flt: Filter, *, cursor: int | str | None, size: int, newest_first: bool
    ) -> Page:
        """Up to *size* rows matching *flt*, from *cursor* on (None: the start). Each batch
        is read from where the last one stopped, named by its entry (:mod:`._cursor`)."""
        rows: list[Row] = []
        places: list[str] = []
        scanned, total, at = 0, -1, cursor
        while total < 0 or (at is not None and len(rows) < size and scanned < SCAN_LIMIT):
            n = size - len(rows) if not flt.by_content else BATCH
            found, batch = await window(
                self.client, key, at, n + 1, newest_first, flt.since_ms, flt.until_ms
            )
            total = found if total < 0 else total
            if size <= 0 or not batch:
                at = place(batch[0].score, batch[0].member) if batch else None
                break
            read = await self._rows(key, batch[:n], flt)
            at = place(batch[n].score, batch[n].member) if len(batch) > n else None
            for i, row in enumerate(read):
                scanned += 1
                if row is not None and flt.matches(row):
                    rows.append(row)
                    places.append(place(batch[i].score, batch[i].member))
                    if len(rows) >= size:
                        after = batch[i + 1] if i + 1 < len(batch) else None
                        at = None if after is None else place(after.score, after.member)
                        break
        return Page(rows, total, None if at is None else str(at), scanned, places)

    async def all_ids(self, key: str, flt: Filter) -> list[str]:
        """Every id matching *flt* (for an action on all that match); with no filter on content
        by their batches alone (100,000 dead letters read as rows took 2.6 s of the loop's
        CPU)."""
        ids: list[str] = []
        if not flt.by_content:
            at: str | None = None
            while True:
                _, found = await window_flat(
                    self.client, key, at, ID_BATCH + 1, False, flt.since_ms, flt.until_ms, True
                )
                members = found[:-1]  # (the last one's score after them)
                ids += [_s(member) for member in members[:ID_BATCH]]
                if len(members) <= ID_BATCH:
                    return ids
                at = place(float(found[-1]), members[-1])
        cursor: str | None = None
        while True:
            page = await self.page(key, flt, cursor=cursor, size=BATCH * 5, newest_first=False)
            ids.extend(r.id for r in page.rows)
            if page.next_cursor is None:
                return ids
            cursor = page.next_cursor

    async def row(self, key: str, entry_id: str) -> Row | None:
        score = await self.client.zscore(key, entry_id)
        if score is None:
            return None
        rows = await self._rows(key, [Entry(entry_id, float(score), entry_id.encode())], Filter())
        return rows[0] if rows else None


def table_key(keys: Keys, table: str) -> str:
    """The sorted set of *table* (``dead`` or ``delayed``) in the shard of *keys*."""
    return keys.dead if table == "dead" else keys.delayed


def route(entry_id: str) -> tuple[int, str]:
    """The shard and the id in it of an id as workers and commands show it
    (:func:`~scrapy_ha.store.shard_sync.outside`: ``<shard>:<id>`` beyond shard 0)."""
    shard, sep, local = entry_id.partition(":")
    return (int(shard), local) if sep and shard.isascii() and shard.isdecimal() else (0, entry_id)


class ShardedTables:
    """Pages of a table of every shard of a crawl, merged by time (one shard: as it is)."""

    def __init__(self, client: Any, shards: list[Keys]) -> None:
        self.parts = [Tables(client, keys) for keys in shards]

    async def page(
        self, table: str, flt: Filter, *, cursor: str | None, size: int, newest_first: bool
    ) -> Page:
        """Up to *size* rows of *table*; *cursor* as a page before gave it (None: start)."""
        if len(self.parts) == 1:
            part = self.parts[0]
            key = table_key(part.keys, table)
            return await part.page(key, flt, cursor=cursor, size=size, newest_first=newest_first)
        places: list[str | None] = (
            [None] * len(self.parts) if cursor is None else list(cursor.split("."))
        )
        if len(places) != len(self.parts):
            raise ValueError(f"cursor {cursor!r} is not one of this crawl's pages")
        pages: list[Page | None] = []
        total = 0
        for part, where in zip(self.parts, places, strict=True):
            key = table_key(part.keys, table)
            if where == DONE:  # nothing more to show: its window's size still counts
                pages.append(None)
                total += (await part.page(key, flt, cursor=None, size=0, newest_first=True)).total
                continue
            found = await part.page(key, flt, cursor=where, size=size, newest_first=newest_first)
            pages.append(found)
            total += found.total
        return _merged(pages, total, size, newest_first)

    async def all_ids(self, table: str, flt: Filter) -> list[str]:
        ids: list[str] = []
        for i, part in enumerate(self.parts):
            found = await part.all_ids(table_key(part.keys, table), flt)
            ids += [outside(i, entry_id) for entry_id in found]
        return ids

    async def row(self, table: str, entry_id: str) -> Row | None:
        shard, local = route(entry_id) if len(self.parts) > 1 else (0, entry_id)
        if shard >= len(self.parts):
            return None
        part = self.parts[shard]
        found = await part.row(table_key(part.keys, table), local)
        return None if found is None else replace(found, id=outside(shard, found.id))


def _merged(pages: list[Page | None], total: int, size: int, newest_first: bool) -> Page:
    """The first *size* rows of the shards' pages by time; where each shard goes on."""
    tagged = [(shard, row) for shard, p in enumerate(pages) if p for row in p.rows]
    tagged.sort(key=lambda t: t[1].at_ms, reverse=newest_first)
    taken = tagged[:size]
    cursor: list[str] = []
    for shard, found in enumerate(pages):
        if found is None:
            cursor.append(DONE)
            continue
        mine = [row for s, row in taken if s == shard]
        if len(mine) < len(found.rows):  # go on from its first row not shown
            cursor.append(found.places[len(mine)])
        else:
            nxt = found.next_cursor
            cursor.append(DONE if nxt is None else str(nxt))
    rows = [replace(row, id=outside(s, row.id)) for s, row in taken]
    scanned = sum(p.scanned for p in pages if p)
    more = any(c != DONE for c in cursor)
    return Page(rows, total, ".".join(cursor) if more else None, scanned)


def page_json(spider: str, table: str, flt: Filter, page: Page) -> dict[str, Any]:
    """A page of a table as the ``/api/`` answers it."""
    return {
        "spider": spider,
        "table": table,
        "filter": flt.as_dict(),
        "total_in_window": page.total,
        "scanned": page.scanned,
        "next_cursor": page.next_cursor,
        "entries": [r.as_dict() for r in page.rows],
    }
