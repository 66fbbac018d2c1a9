"""What the dashboard's pages and its ``/api/`` show: every crawl's summary (how far it
is, how fast it goes, what waits and why), a crawl's numbers, a page of a table (dead
letters, delayed entries) and one entry, read from Redis; a sharded crawl as one."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from fastapi import HTTPException, Request

from scrapy_ha.codec import describe
from scrapy_ha.codec.log_masking import escape_surrogates
from scrapy_ha.codec.masking import mask_value
from scrapy_ha.dashboard._chart import WINDOWS, Window, rate_chart, speed
from scrapy_ha.dashboard._data import body_text, crawl_names, crawl_stats, today_ms
from scrapy_ha.dashboard._tables import Filter, Page, ShardedTables, route
from scrapy_ha.keys import Keys
from scrapy_ha.ops.gates import gates_closed
from scrapy_ha.ops.revisits import read_revisits
from scrapy_ha.ops.shards import crawl_queue
from scrapy_ha.ops.unreadable import UNREADABLE, explain, read_layout_keys
from scrapy_ha.ops.waiting import HELD_KINDS, Waiting, eta, read_waiting
from scrapy_ha.ops.workers import live_workers
from scrapy_ha.store.connection import server_ms
from scrapy_ha.store.items import ItemStream, StreamState, merged
from scrapy_ha.store.payloads import read_payloads
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.runs import read_run, stopped_at
from scrapy_ha.store.state import CheckpointStore

if TYPE_CHECKING:
    from scrapy_ha.ops.stats import CrawlStats

#: Rows per table page unless asked otherwise, and the most a page may hold.
PAGE_SIZE, MAX_PAGE_SIZE = 50, 500
#: Domains listed on a crawl page (the busiest).
TOP_DOMAINS = 20
#: Duration suffixes accepted by the time filters ("24h": the last 24 hours).
DURATIONS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
#: The tables: which end comes first.
TABLES = {"dead": True, "delayed": False}  # newest dead letter first; soonest delayed first
#: Events counted "today" on a crawl page (from the per-minute buckets, kept a day).
TODAY = ("acked", "retried", "dead", "requeued", "purged")


async def crawl_keys(request: Request, spider: str) -> Keys:
    """The crawl's keys; a sharded crawl's are shard 0's, where its crawl-wide keys are (its
    numbers are read from every shard: see :func:`shard_keys`)."""
    keys = Keys(request.app.state.prefix, spider)
    stored = await request.app.state.client.get(keys.shard_count)
    return read_layout_keys(keys.prefix, spider, stored)


async def known_crawl(request: Request, spider: str) -> None:
    """A 404 for a crawl with no key in Redis, as the CLI's "no such crawl" (a mistyped
    name: an action would make its keys, a table would answer empty); the same test as the
    CLI's (its queue's keys, every shard's, then its checkpoints)."""
    client, prefix = request.app.state.client, request.app.state.prefix
    queue = await crawl_queue(client, prefix, spider, None)
    if await queue.exists() or await CheckpointStore(client, queue.keys).exists():
        return
    raise HTTPException(404, f"no such crawl: no key of spider {spider!r} in Redis")


def shard_keys(keys: Keys) -> list[Keys]:
    """The keys of every shard the crawl has keys on (itself when it is not sharded)."""
    return keys.every_shard()


def window_of(request: Request) -> Window:
    """The charts' window of the page (``?window=hour`` or ``day``)."""
    name = request.query_params.get("window") or "hour"
    if name not in WINDOWS:
        raise HTTPException(400, f"window={name!r}: hour or day")
    return WINDOWS[name]


@dataclass(frozen=True)
class Summary:
    """A crawl's summary: what the API answers (``data``) and what the charts read."""

    data: dict[str, Any]
    stats: CrawlStats
    waiting: Waiting


#: Crawls the overview reads at once: each is a dozen round trips to Redis, and 580 crawls
#: read one after the other took 2.4 s (the reads of 16 overlap on as many connections).
OVERVIEW_AT_ONCE = 16


async def overview_rows(request: Request) -> tuple[list[Summary], dict[str, str]]:
    """Every crawl's summary, and why each crawl that cannot be read cannot (spider ->
    ``<key> holds a <type>``): one such crawl costs itself alone."""
    client, prefix = request.app.state.client, request.app.state.prefix
    names = await crawl_names(client, prefix, request.app.state.key_names)
    turns = asyncio.Semaphore(OVERVIEW_AT_ONCE)

    async def row(spider: str) -> Summary | str:
        async with turns:
            try:
                return await _overview_row(request, spider)
            except UNREADABLE as exc:
                return (await explain(client, prefix, spider, exc)).reason

    rows = await asyncio.gather(*(row(spider) for spider in names))
    crawls = [r for r in rows if isinstance(r, Summary)]
    unreadable = {s: r for s, r in zip(names, rows, strict=True) if isinstance(r, str)}
    return crawls, unreadable


async def _overview_row(request: Request, spider: str) -> Summary:
    client = request.app.state.client
    keys = await crawl_keys(request, spider)
    stats = await crawl_stats(client, keys, domains=False)
    return await summary(client, keys, stats)


async def item_stream(client: Any, keys: Keys) -> StreamState:
    """The crawl's item stream (every shard's, for a sharded crawl)."""
    return merged([await ItemStream(client, k).state() for k in keys.every_shard()])


async def summary(client: Any, keys: Keys, stats: CrawlStats) -> Summary:
    """How far the crawl is, how fast it goes, what waits and why, and when it ends."""
    chart = rate_chart(stats, WINDOWS["hour"], fitted=False)  # the API's 60 minutes
    waiting = await read_waiting(client, shard_keys(keys))
    gates = dict(sorted((await gates_closed(client, [keys], stats.now_ms)).items()))
    run = await read_run(client, keys)
    begun = run.pace_from if run else None  # (a young run's pace and ETA)
    acked_before = run.acked_before if run else None
    done = eta(stats, waiting, begun_ms=begun, acked_before=acked_before)
    failed = stats.dead + stats.purged
    left = stats.pending + stats.leased + waiting.delayed
    items = await item_stream(client, keys)
    stop = await stopped_at(client, keys)
    still = stop is not None and not stats.workers  # stopped, and no worker resumed it
    data = {
        "spider": stats.spider,
        "shards": keys.shards,
        "pending": stats.pending,
        "leased": stats.leased,
        "delayed": stats.delayed,
        "dead": stats.dead,
        "workers": stats.workers,
        "paused": (paused := bool(await client.exists(keys.paused))),
        "stopped_at": stop,  # (scrapy-ha stop; None once resumed)
        # Redis's memory above HA_REDIS_MEMORY_HIGH: the workers lease nothing new
        "backpressure": (pressure := bool(await client.exists(keys.pressure))),
        "pages_per_s": round(speed(stats, begun, acked_before), 2),
        "pages_per_s_last_hour": [round(v, 3) for v in chart.series[0].values],
        "progress": {
            "done": stats.acked,
            "dead": failed,
            "left": left,
            "known": stats.acked + failed + left,
        },
        "waiting": {
            "retries": waiting.retries,
            **{kind: waiting.held.get(kind, {}) for kind in HELD_KINDS},
            "last_due": waiting.last_due_ms,
        },
        "gates": gates,
        # (none while nothing moves: paused, stopped with no worker, or held back by memory)
        "eta_s": None
        if done.seconds is None or paused or still or pressure
        else round(done.seconds),
        "continuous": done.continuous,
        "now": stats.now_ms,
        # the item outbox (None: the crawl has none): the slowest sink's backlog
        "items_backlog": items.backlog if items.length or items.groups else None,
        "items": {
            "committed": stats.counter("items"),
            "refused": stats.counter("items_refused"),
            "in_stream": items.length,
            "groups": [{**vars(g), "backlog": g.backlog} for g in items.groups],
        },
    }
    return Summary(data, stats, waiting)


async def crawl_view(request: Request, spider: str) -> Summary:
    """A crawl's page; a crawl that cannot be read raises
    :class:`~scrapy_ha.ops.unreadable.CrawlUnreadable` (naming the key)."""
    try:
        return await _crawl_view(request, spider)
    except UNREADABLE as exc:
        client, prefix = request.app.state.client, request.app.state.prefix
        raise await explain(client, prefix, spider, exc) from None


async def _crawl_view(request: Request, spider: str) -> Summary:
    client = request.app.state.client
    keys = await crawl_keys(request, spider)
    stats = await crawl_stats(client, keys, domains=True)
    if not (stats.active or stats.dead or stats.counters or stats.workers):
        if not await RedisQueue(client, keys).exists():
            raise HTTPException(404, f"no such crawl: no key of spider {spider!r} in Redis")
    now, live = await live_workers(RedisQueue(client, keys))
    midnight_minute = today_ms(stats.now_ms) // 60_000
    today = {
        event: sum(n for m, n in stats.minutes.get(event, {}).items() if m >= midnight_minute)
        for event in TODAY
    }
    success = stats.retry_success_rate
    found = await summary(client, keys, stats)
    found.data.update(
        pending_retries=found.waiting.retries,
        today=today,
        retry_success_rate=None if success is None else round(success, 4),
        counters=stats.counters,
        retried_by_class=stats.retried_by_class,
        dead_by_class=stats.dead_by_class,
        domains=dict(stats.top_domains(TOP_DOMAINS)),
        workers_live=[w.as_dict(now) for w in live],
        revisits=(await read_revisits(client, keys, stats.now_ms)).as_dict(),
    )
    return found


def time_param(name: str, value: str | None, now_ms: int) -> int | None:
    """``24h`` (that long ago), a local date-time (``2026-11-30T17:00``) or ms."""
    value = (value or "").strip()
    if not value:
        return None
    try:
        if value[-1] in DURATIONS and value[:-1].isdigit():
            return now_ms - int(value[:-1]) * DURATIONS[value[-1]]
        if value.isdigit():
            return int(value)
        return int(datetime.fromisoformat(value).astimezone().timestamp() * 1000)
    except (ValueError, OverflowError):  # (a date-time its offset takes past year 1 or 9999)
        raise HTTPException(
            400, f"{name}={value!r}: give a duration (30m, 24h, 7d), a date-time or ms"
        ) from None


def int_param(name: str, value: str | None) -> int | None:
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise HTTPException(400, f"{name}={value!r} is not a whole number") from None


async def filter_from(request: Request, params: Any) -> Filter:
    now = await server_ms(request.app.state.client)
    return Filter(
        failure_class=params.get("class") or None,
        domain=params.get("domain") or None,
        status=int_param("status", params.get("status")),
        since_ms=time_param("since", params.get("since"), now),
        until_ms=time_param("until", params.get("until"), now),
    )


def check_table(table: str) -> str:
    if table not in TABLES:
        raise HTTPException(404, f"no table {table!r}: dead or delayed")
    return table


async def tables_of(request: Request, spider: str) -> ShardedTables:
    keys = await crawl_keys(request, spider)
    return ShardedTables(request.app.state.client, shard_keys(keys))


async def table_page(request: Request, spider: str, table: str) -> tuple[Filter, Page]:
    check_table(table)
    await known_crawl(request, spider)
    tables = await tables_of(request, spider)
    q = request.query_params
    flt = await filter_from(request, q)
    # 1 to MAX_PAGE_SIZE rows: a size below 1 read nothing and gave a cursor that never moved
    asked = int_param("size", q.get("size"))
    size = max(1, min(PAGE_SIZE if asked is None else asked, MAX_PAGE_SIZE))
    cursor = q.get("cursor") or None
    try:
        page = await tables.page(table, flt, cursor=cursor, size=size, newest_first=TABLES[table])
    except ValueError:
        raise HTTPException(400, f"cursor={cursor!r} is not a page of this table") from None
    return flt, page


async def entry_view(request: Request, spider: str, table: str, entry_id: str) -> dict[str, Any]:
    check_table(table)
    await known_crawl(request, spider)
    keys = await crawl_keys(request, spider)
    row = await ShardedTables(request.app.state.client, shard_keys(keys)).row(table, entry_id)
    if row is None:
        raise HTTPException(404, f"no {table} entry {entry_id} in {spider}")
    shard, local = route(entry_id) if keys.shard is not None else (0, entry_id)
    (payload,) = await read_payloads(request.app.state.client, shard_keys(keys)[shard], [local])
    stored = describe(payload)
    entry = {
        **row.as_dict(),
        "history": mask_value(row.history),
        "request": stored.printable(),  # the stored form, secrets masked, as in `dlq show`
        "shown": stored.shown(),  # the same by Scrapy's names
        "body": body_text(stored.shown_body),
    }
    return escape_surrogates(entry)  # type: ignore[no-any-return]  # a dict as it came


async def urls_of(request: Request, spider: str, table: str, ids: list[str]) -> dict[str, str]:
    """The URLs (masked) of entries *ids* of *table*, for a confirmation page."""
    tables = await tables_of(request, spider)
    found = {}
    for entry_id in ids:
        row = await tables.row(table, entry_id)
        found[entry_id] = row.url if row is not None else "(gone meanwhile)"
    return found
