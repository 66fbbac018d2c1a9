"""What the dashboard's pages and its ``/api/`` show: every crawl's summary, a crawl's
numbers, a page of a table (dead letters, delayed retries) and one entry, read from Redis."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from fastapi import HTTPException, Request

from scrapy_ha.codec import describe
from scrapy_ha.codec.masking import mask_value
from scrapy_ha.dashboard._chart import rate_chart
from scrapy_ha.dashboard._data import (
    CHART_MINUTES,
    Filter,
    Page,
    Tables,
    body_text,
    crawl_names,
    crawl_stats,
    open_gates,
    today_ms,
)
from scrapy_ha.keys import Keys
from scrapy_ha.ops.workers import live_workers
from scrapy_ha.store.items import ItemStream, StreamState, merged
from scrapy_ha.store.queue import RedisQueue
from scrapy_ha.store.sharding import layout_keys

if TYPE_CHECKING:
    from scrapy_ha.ops.stats import CrawlStats

#: Rows per table page unless asked otherwise, and the most a page may hold.
PAGE_SIZE, MAX_PAGE_SIZE = 50, 500
#: Domains listed on a crawl page (the busiest).
TOP_DOMAINS = 20
#: Duration suffixes accepted by the time filters ("24h": the last 24 hours).
DURATIONS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
#: The tables: which set they page, which end comes first.
TABLES = {"dead": True, "delayed": False}  # newest dead letter first; soonest retry first


async def crawl_keys(request: Request, spider: str) -> Keys:
    """The crawl's keys; a sharded crawl's are shard 0's, where its crawl-wide keys are (its
    numbers are read from every shard: see :func:`scrapy_ha.stats.read_crawl_stats`)."""
    keys = Keys(request.app.state.prefix, spider)
    stored = await request.app.state.client.get(keys.shard_count)
    return layout_keys(keys.prefix, spider, stored)


def one_shard(keys: Keys) -> None:
    """The dead and delayed tables read one shard: refused for a sharded crawl."""
    if keys.shard is not None:
        raise HTTPException(
            409,
            f"the dashboard's tables do not read sharded crawls yet ({keys.spider} has "
            f"HA_SHARDS={keys.shards}): use `scrapy-ha dlq list {keys.spider}`",
        )


# -- reading --------------------------------------------------------------------------------


async def overview_rows(request: Request) -> list[dict[str, Any]]:
    client = request.app.state.client
    crawls = []
    for spider in await crawl_names(client, request.app.state.prefix):
        keys = await crawl_keys(request, spider)
        stats = await crawl_stats(client, keys, domains=False)
        crawls.append(await summary(client, keys, stats))
    return crawls


async def is_paused(client: Any, keys: Keys) -> bool:
    return bool(await client.exists(keys.paused))


async def item_stream(client: Any, keys: Keys) -> StreamState:
    """The crawl's item stream (every shard's, for a sharded crawl)."""
    return merged([await ItemStream(client, k).state() for k in keys.every_shard()])


async def summary(client: Any, keys: Keys, stats: CrawlStats) -> dict[str, Any]:
    chart = rate_chart(stats, CHART_MINUTES)
    eta = stats.eta_seconds()
    items = await item_stream(client, keys)
    return {
        "spider": stats.spider,
        "pending": stats.pending,
        "leased": stats.leased,
        "delayed": stats.delayed,
        "dead": stats.dead,
        "workers": stats.workers,
        "paused": await is_paused(client, keys),
        "pages_per_s": round(chart.last, 2),
        "pages_per_s_last_hour": [round(v, 3) for v in chart.per_second],
        "chart_points": chart.points,
        "chart_peak": round(chart.peak, 2),
        "eta_s": None if eta is None else round(eta),
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


async def crawl_view(request: Request, spider: str) -> dict[str, Any]:
    client = request.app.state.client
    keys = await crawl_keys(request, spider)
    stats = await crawl_stats(client, keys, domains=True)
    now, live = await live_workers(RedisQueue(client, keys))
    midnight_minute = today_ms(stats.now_ms) // 60_000
    today = {
        event: sum(n for m, n in stats.minutes.get(event, {}).items() if m >= midnight_minute)
        for event in ("retried", "dead", "acked")
    }
    success = stats.retry_success_rate
    return {
        **await summary(client, keys, stats),
        "pending_retries": stats.delayed,
        "today": today,
        "retry_success_rate": None if success is None else round(success, 4),
        "counters": stats.counters,
        "retried_by_class": stats.retried_by_class,
        "dead_by_class": stats.dead_by_class,
        "domains": dict(stats.top_domains(TOP_DOMAINS)),
        "gates": await open_gates(client, keys, stats.now_ms),
        "workers_live": [w.as_dict(now) for w in live],
    }


async def server_ms(client: Any) -> int:
    seconds, micros = await client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def time_param(name: str, value: str | None, now_ms: int) -> int | None:
    """``24h`` (that long ago), a local date-time (``2026-11-30T17:00``) or ms."""
    if not value:
        return None
    value = value.strip()
    try:
        if value[-1] in DURATIONS and value[:-1].isdigit():
            return now_ms - int(value[:-1]) * DURATIONS[value[-1]]
        if value.isdigit():
            return int(value)
        return int(datetime.fromisoformat(value).astimezone().timestamp() * 1000)
    except ValueError:
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


def table_key(keys: Keys, table: str) -> str:
    if table not in TABLES:
        raise HTTPException(404, f"no table {table!r}: dead or delayed")
    return keys.dead if table == "dead" else keys.delayed


async def table_page(request: Request, spider: str, table: str) -> tuple[Filter, Page]:
    keys = await crawl_keys(request, spider)
    one_shard(keys)
    key = table_key(keys, table)
    q = request.query_params
    flt = await filter_from(request, q)
    size = min(int_param("size", q.get("size")) or PAGE_SIZE, MAX_PAGE_SIZE)
    tables = Tables(request.app.state.client, keys)
    cursor = int_param("cursor", q.get("cursor"))
    return flt, await tables.page(key, flt, cursor=cursor, size=size, newest_first=TABLES[table])


async def entry_view(request: Request, spider: str, table: str, entry_id: str) -> dict[str, Any]:
    keys = await crawl_keys(request, spider)
    one_shard(keys)
    client = request.app.state.client
    row = await Tables(client, keys).row(table_key(keys, table), entry_id)
    if row is None:
        raise HTTPException(404, f"no {table} entry {entry_id} in {spider}")
    summary = describe(await client.hget(keys.payload, entry_id))
    return {
        **row.as_dict(),
        "history": mask_value(row.history),
        "request": summary.printable(),  # secrets masked, as in `dlq show`
        "body": body_text(summary.shown_body),
    }
