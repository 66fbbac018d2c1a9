"""``scrapy-ha status``: what a crawl is doing, from the crawl-wide counters in Redis.

Every worker's transitions are counted once, by the scripts that make them, so the numbers
are the crawl's, however many workers it has: the size of each state, totals since the
crawl began, retries and dead letters per failure class, the retry success rate, rates per
minute, an ETA and the busiest domains. ``--watch`` refreshes in place, ``--json`` prints
one object with the keys documented in docs/reference.md.
"""

from __future__ import annotations

__all__ = ["status"]

import asyncio
import contextlib
import json
import sys
from typing import TYPE_CHECKING, Any

from scrapy_ha.cli.common import plural
from scrapy_ha.cli.grammar import TOP_DOMAINS
from scrapy_ha.cli.pause import paused_since
from scrapy_ha.cli.watch import CLEAR_SCREEN, controls, draw, restore_ctrl_c, stop_on_ctrl_c
from scrapy_ha.config.politeness import DomainLimit, describe, held_slots, limits_in_force
from scrapy_ha.ops.display import humanize, local_time, most_domains, per_class, share_text, time_ms
from scrapy_ha.ops.dupefilter import buckets_lines, dupefilter_json, dupefilter_line
from scrapy_ha.ops.operations import server_ms
from scrapy_ha.ops.revisits import read_revisits, status_lines
from scrapy_ha.ops.stats import (
    COUNTERS,
    DOMAIN_EVENTS,
    MINUTE_EVENTS,
    CrawlStats,
    read_crawl_stats_async,
)
from scrapy_ha.ops.waiting import ETA_WINDOW, HELD_KINDS, Waiting, eta, read_waiting
from scrapy_ha.store.bloom_state import BloomState, bloom_state
from scrapy_ha.store.buckets import BucketState, bucket_state
from scrapy_ha.store.health import evicts, redis_health
from scrapy_ha.store.items import crawl_items
from scrapy_ha.store.runs import RunState, read_run, stopped_at
from scrapy_ha.store.sharding import shards_of

if TYPE_CHECKING:
    import argparse

    from scrapy_ha.ops.waiting import Eta
    from scrapy_ha.store.items import StreamState
    from scrapy_ha.store.queue import RedisQueue

#: The rate windows shown, in minutes: the last minute, a smoothed recent rate, the hour.
RATE_WINDOWS = (1, 5, 60)
#: The counters of the ``totals`` line (the rest have lines of their own).
TOTALS = ("enqueued", "filtered", "start_duplicates", "acked", "reclaimed", "poison")


async def status(queue: RedisQueue, args: argparse.Namespace) -> int:
    """States, totals, retries and dead letters per class, rates, an ETA, top domains."""
    stop = stop_on_ctrl_c() if args.watch is not None else None
    try:
        await _show(queue, args, stop)
    except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels the command; ends --watch
        if args.watch is None:
            raise
    finally:
        if stop is not None:
            restore_ctrl_c()
    return 0


async def _show(queue: RedisQueue, args: argparse.Namespace, stop: asyncio.Event | None) -> None:
    out = sys.stdout
    in_place = args.watch is not None and out.isatty() and not args.json
    if in_place:
        controls(out)(CLEAR_SCREEN)
    while stop is None or not stop.is_set():
        stats = await read_crawl_stats_async(queue.client, queue.keys, domains=args.domains > 0)
        waiting = await read_waiting(queue.client, [s.keys for s in shards_of(queue)])
        paused = await paused_since(queue)
        health = await redis_health(queue.client)
        limits, held = await _politeness(queue)
        items = await crawl_items(queue)
        blooms, buckets, pressure = await _memory(queue)
        revisits = await read_revisits(queue.client, queue.keys, stats.now_ms)
        run = await read_run(queue.client, queue.keys)
        stopped = await stopped_at(queue.client, queue.keys)
        still = stopped is not None and not stats.workers  # (a live one started after it)
        if args.json:
            doc = {**as_json(stats, waiting, args.domains, run), "paused": paused}
            doc["redis"] = health
            if (paused or still or pressure) and doc["eta_seconds"]:  # nothing moves
                doc["eta_seconds"] = None
            doc["items"] = items_json(stats, items)
            doc["dupefilter"] = dupefilter_json(blooms, buckets)
            doc["backpressure"] = pressure
            doc["revisits"] = revisits.as_dict() if revisits else None
            doc["domain_limits"] = {d: vars(lim) for d, lim in limits.items()}
            doc["domain_slots"] = held
            doc["run"] = run.as_dict() if run else None
            doc["stopped_at"] = stopped
            out.write(json.dumps(doc) + "\n")
        else:
            why = "paused" if paused else "stopped" if still else HELD if pressure else ""
            lines = text(stats, waiting, args.domains, still=why, run=run)
            if paused:
                lines.insert(1, f"{'paused':>13}  since {paused} (`scrapy-ha resume` to go on)")
            lines[1:1] = [_run_line(run)] if run else []
            if still and stopped is not None:
                lines.insert(1, _stopped_line(stopped, paused=bool(paused)))
            lines += items_text(stats, items)
            if limits:
                limited = stats.counter("domain_limited")
                lines.append(f"{'limits':>13}  {describe(limits, held)}; held back {limited:,}")
            lines += ([dupefilter_line(blooms)] if blooms else []) + buckets_lines(buckets)
            lines += _pressure_lines(pressure, health)
            lines += status_lines(revisits)  # a continuous crawl's
            lines.append(f"{'redis':>13}  {'; '.join(health) or 'ok'}")
            draw(out, lines, in_place=in_place, last=args.watch is None)
        out.flush()
        if args.watch is None or stop is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(args.watch):
                await stop.wait()


def _stopped_line(at: int, *, paused: bool) -> str:
    """A crawl stopped (``scrapy-ha stop``) no worker runs now (paused: one started waits)."""
    then = "joins it, paused" if paused else "resumes it"
    return (
        f"{'stopped':>13}  at {local_time(at)} (`scrapy-ha stop`): no worker runs it; "
        f"a worker started now {then}"
    )


def _run_line(run: RunState) -> str:
    """Which run of a crawl started again (SCHEDULER_PERSIST) this is; its totals count all."""
    when = f"begun {local_time(run.started)}" if run.started else "begun at a time not kept"
    ended = f", ended {local_time(run.ended)}" if not run.open and run.ended else ""
    every = f"; the totals count runs 1 to {run.number}" if run.number > 1 else ""
    return f"{'run':>13}  {run.number}, {when}{ended}{every}"


async def _politeness(queue: RedisQueue) -> tuple[dict[str, DomainLimit], dict[str, int]]:
    """The crawl-wide per-domain limits in force and the slots held (two small hashes)."""
    limits = limits_in_force(await queue.client.hgetall(queue.keys.domain_limits))
    held = held_slots(await queue.client.hgetall(queue.keys.polite)) if limits else {}
    return limits, held


async def _memory(
    queue: RedisQueue,
) -> tuple[list[BloomState], list[BucketState], dict[str, int] | None]:
    """Each shard's Bloom filter or buckets of the exact set, and the back-pressure mark."""
    blooms, buckets = [], []
    now_ms = await server_ms(queue.client)
    for shard in shards_of(queue):
        state = bloom_state(await queue.client.hgetall(shard.keys.bloom), now_ms)
        if state is not None:
            blooms.append(state)
        held = bucket_state(await queue.client.hgetall(shard.keys.buckets))
        if held is not None:
            buckets.append(held)
    return blooms, buckets, _read_mark(await queue.client.get(queue.keys.pressure))


def _read_mark(raw: bytes | None) -> dict[str, int] | None:
    """The back-pressure mark (pressure.py writes it); one that is not (written by hand)
    is shown with zeros: the status goes on, and says workers are held back."""
    if raw is None:
        return None
    try:
        mark = json.loads(raw)
        found = {k: int(mark.get(k) or 0) for k in ("used", "max", "high", "low")}
        return {**found, "since": time_ms(mark.get("since") or 0)}
    except (ValueError, TypeError, AttributeError, OverflowError):
        return dict.fromkeys(("used", "max", "high", "low", "since"), 0)


def _pressure_lines(mark: dict[str, int] | None, health: list[str] | None = None) -> list[str]:
    kept = "Redis deletes keys (redis, below)" if evicts(health or []) else "nothing is lost"
    if not mark:
        return []
    since = local_time(mark.get("since", 0))
    mb = {k: f"{mark.get(k, 0) / 2**20:,.1f} MB" for k in ("used", "max", "high", "low")}
    of = f"of {mb['max']}" if mark.get("max") else "(no maxmemory)"  # (marks in bytes)
    return [
        f"{'back-pressure':>13}  since {since}: Redis uses {mb['used']} {of} "
        f"(HA_REDIS_MEMORY_HIGH {mb['high']}): workers lease nothing new until "
        f"it falls below {mb['low']}; {kept}"
    ]


# -- JSON --------------------------------------------------------------------------------


def as_json(
    stats: CrawlStats, waiting: Waiting, domains: int = TOP_DOMAINS, run: RunState | None = None
) -> dict[str, Any]:
    """The status as one JSON object (stable keys: see docs/reference.md); *run*: the
    crawl's newest run (the ETA's rate: since it began, if later)."""
    return {
        "spider": stats.spider,
        "time": stats.now_ms,
        "pending": stats.pending,
        "leased": stats.leased,
        "delayed": stats.delayed,
        "dead": stats.dead,
        "workers": stats.workers,
        "fingerprints": stats.fingerprints,
        "totals": {name: stats.counter(name) for name in COUNTERS},
        "retried_by_class": stats.retried_by_class,
        "dead_by_class": stats.dead_by_class,
        "retry_success_rate": stats.retry_success_rate,
        "rates": {
            event: {f"{m}m": round(stats.rate(event, m), 2) for m in RATE_WINDOWS}
            for event in MINUTE_EVENTS
        },
        "eta_seconds": _rounded(_found_eta(stats, waiting, run).seconds),
        "waiting": {
            "retries": waiting.retries,
            **{kind: waiting.held.get(kind, {}) for kind in HELD_KINDS},
            "last_due": waiting.last_due_ms,
        },
        "domains": [
            {"domain": d, **{e: counts.get(e, 0) for e in DOMAIN_EVENTS}}
            for d, counts in stats.top_domains(domains)
        ],
    }


def items_json(stats: CrawlStats, items: StreamState) -> dict[str, Any]:
    """The item stream (HA_ITEMS = "outbox"): committed, refused, in the stream, and
    each sink's consumer group."""
    return {
        "committed": stats.counter("items"),
        "refused": stats.counter("items_refused"),
        "in_stream": items.length,
        "aside": items.aside,
        "backlog": items.backlog,
        "groups": [{**vars(g), "backlog": g.backlog} for g in items.groups],
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


# -- text --------------------------------------------------------------------------------


def text(
    stats: CrawlStats,
    waiting: Waiting,
    domains: int = TOP_DOMAINS,
    *,
    still: str = "",
    run: RunState | None = None,
) -> list[str]:
    """The status as lines of text, for a terminal (no ETA while the crawl is *still*:
    "paused", "stopped" with no worker, or held back by Redis's memory: HELD)."""
    until = _still_eta(stats, waiting, still) or _eta(stats, waiting, run)
    lines = [
        f"{stats.spider} at {local_time(stats.now_ms)}: {stats.workers} live worker(s)",
        _row(
            "state",
            pending=stats.pending,
            leased=stats.leased,
            delayed=stats.delayed,
            dead=stats.dead,
            fingerprints=stats.fingerprints,
        ),
        _row("totals", **{name: stats.counter(name) for name in TOTALS}),
        _row("operator", requeued=stats.requeued, purged=stats.purged),
        per_class("retried", stats.retried, stats.retried_by_class) + _success(stats),
        per_class("dead-lettered", stats.dead_lettered, stats.dead_by_class),
        *(_rates(stats, event) for event in MINUTE_EVENTS),
        *_waiting(waiting),
        f"{'eta':>13}  {until}",
    ]
    return lines + _domains(stats, domains)


def items_text(stats: CrawlStats, items: StreamState) -> list[str]:
    """The item stream's lines (none for a crawl without the item outbox)."""
    committed = stats.counter("items")
    if not (committed or items.length or items.groups):
        return []
    rate = stats.rate("items", ETA_WINDOW)
    lines = [
        _row("items", committed=committed, refused=stats.counter("items_refused"))
        + f"  in stream {items.length:,}  {rate:,.1f}/min ({ETA_WINDOW}m)"
        + (f"  aside {items.aside:,} (`--aside` lists them)" if items.aside else "")
    ]
    if not items.groups:
        lines.append(f"{'sinks':>13}  none yet: `scrapy-ha items {stats.spider} --to ...`")
    for g in items.groups:
        aside = f", set aside {g.set_aside:,} in all" if g.set_aside else ""
        lines.append(
            f"{'sink':>13}  {g.name}: backlog {g.backlog:,}, consumed {g.consumed:,}"
            f"{aside}, {g.consumers} consumer(s)"
        )
    return lines


def _row(title: str, **values: int) -> str:
    return f"{title:>13}  " + "  ".join(f"{k} {v:,}" for k, v in values.items())


def _success(stats: CrawlStats) -> str:
    rate = stats.retry_success_rate
    if rate is None:
        return ""
    return f"; retry success {share_text(rate)} ({stats.retry_ok:,} ok, {stats.retry_dead:,} dead)"


def _rates(stats: CrawlStats, event: str) -> str:
    rates = "  ".join(f"{stats.rate(event, m):,.1f} ({m}m)" for m in RATE_WINDOWS)
    return f"{event + '/min':>13}  {rates}"


#: Why a delayed entry waits without an attempt, as the ``delayed`` line says it.
WAITS = (
    ("gate", "waiting for a closed gate"),
    ("limit", "held by domain limits"),
    ("revisit", "revisits waiting for their next visit"),
    ("proxy", "waiting for a usable proxy"),
    ("dictionary", "waiting for their compaction dictionary"),
)


def _waiting(waiting: Waiting) -> list[str]:
    """What the delayed set holds, by why: retries, a closed gate, a domain's limits, the
    next visits of revisited pages; then the pending requests held back in their hosts'
    back queues (a closed gate, a domain's limits)."""
    lines = []
    if waiting.delayed:
        parts = [plural(waiting.retries, "retry", "retries")]
        for kind, why in WAITS:
            if marked := waiting.marked(kind):
                parts.append(f"{sum(marked.values()):,} {why} ({most_domains(marked)})")
        due = waiting.last_due_ms
        last = f"; the last due {local_time(due)}" if due else ""
        lines.append(f"{'delayed':>13}  {waiting.delayed:,}: " + ", ".join(parts) + last)
    parts = []
    for kind, why in (("gate", "behind a closed gate"), ("limit", "at their domain's limits")):
        if hosts := waiting.parked.get(kind):
            parts.append(f"{sum(hosts.values()):,} {why} ({most_domains(hosts)})")
    if parts:
        lines.append(f"{'parked':>13}  pending: " + ", ".join(parts))
    return lines


HELD = "held back by Redis's memory"


def _still_eta(stats: CrawlStats, waiting: Waiting, still: str) -> str:
    """The ETA of a crawl that does not move: paused, stopped with no worker, or held back
    by Redis's memory until it is freed ("" if it moves; each was given a countdown)."""
    return f"none while {still}: {eta(stats, waiting).left:,} left" if still else ""


def _found_eta(stats: CrawlStats, waiting: Waiting, run: RunState | None) -> Eta:
    """The ETA, at the pace since the run began if it is younger than the window."""
    if run is None:
        return eta(stats, waiting)
    return eta(stats, waiting, begun_ms=run.pace_from, acked_before=run.acked_before)


def _eta(stats: CrawlStats, waiting: Waiting, run: RunState | None = None) -> str:
    found = _found_eta(stats, waiting, run)
    if found.continuous:
        return "none: a continuous crawl (revisits) ends only when stopped (`scrapy-ha stop`)"
    if not found.left:
        return "nothing left"
    if found.seconds is None:
        why = f"nothing acked in the last {ETA_WINDOW} minutes"
        if run is not None and (run.pace_from or 0) > stats.now_ms:  # (RunState.pace_from)
            why = "the run's pace counted from its next minute (opened by an earlier version)"
        return f"unknown: {found.left:,} left, {why}"
    return (
        f"{humanize(found.seconds)} ({found.left:,} left at the ack rate of the last "
        f"{ETA_WINDOW}m or since the first ack, delayed work not before it is due)"
    )


def _domains(stats: CrawlStats, n: int) -> list[str]:
    if not (top := [(" ".join(d.split()), c) for d, c in stats.top_domains(n)]):
        return []
    width = max(len(d) for d, _ in top)
    head = f"{'domain':<{width}}  " + "  ".join(f"{e:>9}" for e in DOMAIN_EVENTS)
    rows = [
        f"{d:<{width}}  " + "  ".join(f"{c.get(e, 0):>9,}" for e in DOMAIN_EVENTS) for d, c in top
    ]
    return [f"{'top domains':>13}", *(f"{'':>13}  {line}" for line in (head, *rows))]
