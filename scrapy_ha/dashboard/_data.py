"""What the dashboard reads from Redis: the crawls under a prefix, a crawl's numbers, and
pages of its delayed retries and dead letters.

Pages are read by rank in the sorted sets (``ZRANGE`` by index, the time window turned into
ranks with ``ZCOUNT``), never by loading a whole set: a page deep in a million entries costs
what the page costs. A filter on content (class, domain, status) scans on from where the
last page stopped, at most :data:`SCAN_LIMIT` entries per page, and says where to go on.
Stored requests are read with the codec's :func:`~scrapy_ha.codec.describe`: data, never
rebuilt, credentials already stripped when they were stored, and what is kept for a worker
to redo the request masked (:mod:`scrapy_ha.codec.masking`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy_ha import metakeys
from scrapy_ha.codec import RequestSummary, describe
from scrapy_ha.codec.document import META
from scrapy_ha.codec.masking import mask_text, mask_url, mask_value
from scrapy_ha.deadletters.dlq import DeadEntry, parse_entry
from scrapy_ha.ops.crawls import unsharded
from scrapy_ha.ops.stats import CrawlStats, read_crawl_stats_async

if TYPE_CHECKING:
    from scrapy_ha.dashboard._actions import Action
    from scrapy_ha.keys import Keys

#: Entries read per round trip while a filtered page is filled (few round trips, each small).
BATCH = 1000
#: Entries a filtered page examines at most before it stops and offers "older": a page
#: with a rare filter answers within about a second, and the next page goes on from there.
SCAN_LIMIT = 5_000
#: Keys per SCAN call while looking for crawls: few calls, none of them long.
KEY_SCAN_COUNT = 1000
#: Minutes of the rate chart on the overview (the last hour).
CHART_MINUTES = 60


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _glob_escape(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\{}" else c for c in text)


async def crawl_names(client: Any, prefix: str) -> list[str]:
    """The spiders that have keys under *prefix* (``<prefix>:{<spider>}:*``)."""
    head = f"{prefix}:{{"
    names: set[str] = set()
    async for key in client.scan_iter(match=_glob_escape(head) + "*", count=KEY_SCAN_COUNT):
        rest = _s(key)[len(head) :]
        end = rest.find("}:")
        if end > 0:
            names.add(rest[:end])
    return unsharded(names)  # a sharded crawl's shards are one crawl


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
    """One delayed retry or dead letter as a table shows it (URL, reason, history masked)."""

    id: str
    url: str
    failure_class: str
    status: int | None
    attempts: int
    #: Next retry (delayed) or the time it was dead-lettered (dead), server ms.
    at_ms: int
    reason: str
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def domain(self) -> str:
        return (urlsplit(self.url).hostname or "").lower()

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
    """A page of a table: its rows, how many entries the time window holds, and the rank to
    go on from (None: nothing older/later)."""

    rows: list[Row]
    total: int
    next_cursor: int | None
    scanned: int


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
        history=mask_value(list(entry.info.get("history") or [])),
    )


def _meta(summary: RequestSummary) -> dict[str, Any]:
    meta = summary.document.get(META)
    return meta if isinstance(meta, dict) else {}


def delayed_row(entry_id: str, due_ms: float, summary: RequestSummary) -> Row:
    """A delayed retry: its class and reason are those of its last attempt."""
    meta = _meta(summary)
    history = meta.get(metakeys.HISTORY)
    history = history if isinstance(history, list) else []
    last = history[-1] if history and isinstance(history[-1], dict) else {}
    retries = meta.get(metakeys.RETRIES)
    attempts = (
        sum(v for v in retries.values() if isinstance(v, int)) if isinstance(retries, dict) else 0
    )
    return Row(
        id=entry_id,
        url=mask_url(summary.url or "?"),
        failure_class=str(last.get("class") or "unknown"),
        status=None,
        attempts=attempts,
        at_ms=int(due_ms),
        reason=mask_text(str(last.get("outcome") or "")),
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
    """Pages of the delayed and dead-letter sets of one crawl."""

    def __init__(self, client: Any, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    async def _ranks(self, key: str, flt: Filter) -> tuple[int, int]:
        """Ranks of the first and last member within the filter's time window."""
        since, until = flt.since_ms, flt.until_ms
        first = 0 if since is None else await self.client.zcount(key, "-inf", f"({since}")
        if until is None:
            last = await self.client.zcard(key) - 1
        else:
            last = await self.client.zcount(key, "-inf", until) - 1
        return int(first), int(last)

    async def _rows(self, key: str, start: int, stop: int, flt: Filter) -> list[Row | None]:
        """The members of ranks *start* to *stop* as rows, in rank order; ``None`` for a
        member a cheap look shows *flt* cannot match (the rest of it is then never read)."""
        ids = [_s(m) for m in await self.client.zrange(key, start, stop)]
        if not ids:
            return []
        if key == self.keys.delayed:
            payloads = await self.client.hmget(self.keys.payload, ids)
            wanted = [n for n, p in enumerate(payloads) if _may_match(flt, None, p)]
        else:
            infos = await self.client.hmget(self.keys.dead_info, ids)
            wanted = [n for n, info in enumerate(infos) if _may_match(flt, info, None)]
        rows: list[Row | None] = [None] * len(ids)
        if not wanted:
            return rows
        chosen = [ids[n] for n in wanted]
        scores = await self.client.zmscore(key, chosen)
        if key == self.keys.delayed:
            for n, score in zip(wanted, scores, strict=True):
                rows[n] = delayed_row(ids[n], score or 0, describe(payloads[n]))
            return rows
        payloads = await self.client.hmget(self.keys.payload, chosen)
        for n, score, payload in zip(wanted, scores, payloads, strict=True):
            if _may_match(flt, None, payload):
                rows[n] = dead_row(parse_entry(ids[n], score or 0, infos[n], payload))
        return rows

    async def page(
        self, key: str, flt: Filter, *, cursor: int | None, size: int, newest_first: bool
    ) -> Page:
        """Up to *size* rows matching *flt*, from rank *cursor* on (None: the start)."""
        first, last = await self._ranks(key, flt)
        total = max(0, last - first + 1)
        pos = (last if newest_first else first) if cursor is None else cursor
        rows: list[Row] = []
        scanned = 0
        while first <= pos <= last and len(rows) < size and scanned < SCAN_LIMIT:
            n = size - len(rows) if not flt.by_content else BATCH
            lo, hi = (
                (max(first, pos - n + 1), pos) if newest_first else (pos, min(last, pos + n - 1))
            )
            batch = await self._rows(key, lo, hi, flt)
            if newest_first:
                batch.reverse()
            for row in batch:
                pos += -1 if newest_first else 1
                scanned += 1
                if row is not None and flt.matches(row):
                    rows.append(row)
                    if len(rows) >= size:
                        break
            if not batch:
                break
        more = first <= pos <= last
        return Page(rows, total, pos if more else None, scanned)

    async def all_ids(self, key: str, flt: Filter) -> list[str]:
        """Every id matching *flt* (for an action on all that match)."""
        ids: list[str] = []
        cursor: int | None = None
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
        rank = await self.client.zrank(key, entry_id)
        rows = await self._rows(key, int(rank), int(rank), Filter())
        return rows[0] if rows else None


async def open_gates(client: Any, keys: Keys, now_ms: int) -> dict[str, int]:
    """Domains closed to every worker now, with the time they open (server ms)."""
    gates = await client.hgetall(keys.gates)
    out = {}
    for domain, until in gates.items():
        try:
            if int(until) > now_ms:
                out[_s(domain)] = int(until)
        except ValueError:
            continue
    return dict(sorted(out.items()))


async def crawl_stats(client: Any, keys: Keys, *, domains: bool) -> CrawlStats:
    return await read_crawl_stats_async(client, keys, domains=domains)


# -- formatting -------------------------------------------------------------------------


def today_ms(now_ms: int) -> int:
    """Local midnight of the day of *now_ms*."""
    day = datetime.fromtimestamp(now_ms / 1000).astimezone()
    return int(day.replace(hour=0, minute=0, second=0, microsecond=0).timestamp() * 1000)


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


def body_text(raw: bytes) -> str:
    """A request body as text: as it is when UTF-8, else with its bytes escaped."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return raw.decode("latin-1").encode("unicode_escape").decode()


def report(action: Action, touched: int, selected: int) -> str:
    """What an action did, as the page that ran it says it."""
    if action.table is None:
        return action.done if touched else f"was {action.done} already"
    return f"{action.done} {touched} of {selected} entr{'y' if selected == 1 else 'ies'}"
