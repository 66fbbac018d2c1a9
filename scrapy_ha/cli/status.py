"""``scrapy-ha status``: what a crawl is doing, from the crawl-wide counters in Redis.

Every worker's transitions are counted once, by the scripts that make them, so the numbers
are the crawl's, however many workers it has: the size of each state, totals since the
crawl began, retries and dead letters per failure class, the retry success rate, rates per
minute, an ETA and the busiest domains. ``--watch`` refreshes in place, ``--json`` prints
one object with the keys documented in docs/reference.md.
"""

from __future__ import annotations

__all__ = ["add_status_arguments", "status"]

import asyncio
import contextlib
import json
import signal
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Any, TextIO

from scrapy_ha.cli.pause import paused_since
from scrapy_ha.config.politeness import DomainLimit, describe, held_slots, limits_in_force
from scrapy_ha.ops.stats import (
    COUNTERS,
    DOMAIN_EVENTS,
    MINUTE_EVENTS,
    CrawlStats,
    read_crawl_stats_async,
)
from scrapy_ha.store.bloom import BloomState, bloom_state
from scrapy_ha.store.health import redis_health
from scrapy_ha.store.sharding import shards_of
from scrapy_ha.store.state import CheckpointStore

if TYPE_CHECKING:
    import argparse

    from scrapy_ha.store.queue import RedisQueue

#: The rate windows shown, in minutes: the last minute, a smoothed recent rate, the hour.
RATE_WINDOWS = (1, 5, 60)
#: The window of the ack rate the ETA divides by: long enough to smooth a slow page or a
#: pause between batches, short enough to follow a crawl that speeds up or slows down.
ETA_WINDOW = 5
#: Seconds between two refreshes of ``--watch`` without a value: a terminal stays calm and a
#: crawl of a few hundred pages per second still moves visibly.
WATCH_SECONDS = 2.0
#: Domains shown (``--domains``): a screenful with the rest of the status.
TOP_DOMAINS = 10
#: Terminal controls: cursor home, clear to the end of the line, clear the rest of the screen,
#: clear the whole screen. Drawing over the last frame line by line (instead of clearing first)
#: keeps the screen from flickering.
HOME, CLEAR_LINE, CLEAR_BELOW, CLEAR_SCREEN = "\x1b[H", "\x1b[K", "\x1b[J", "\x1b[2J"


def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``status``."""
    parser.add_argument("--json", action="store_true", help="one JSON object (one per refresh)")
    parser.add_argument(
        "--watch",
        nargs="?",
        type=float,
        const=WATCH_SECONDS,
        metavar="SECONDS",
        help=f"refresh every SECONDS (default {WATCH_SECONDS:g}) until Ctrl-C",
    )
    parser.add_argument(
        "--domains",
        type=int,
        default=TOP_DOMAINS,
        metavar="N",
        help=f"the N domains with the most acks (default {TOP_DOMAINS}; 0: none)",
    )


async def status(queue: RedisQueue, args: argparse.Namespace) -> int:
    """States, totals, retries and dead letters per class, rates, an ETA, top domains."""
    if not await _crawl_exists(queue):
        print(
            f"no such crawl: no keys of spider {queue.keys.spider!r} under "
            f"{queue.keys.pending.rsplit(':', 1)[0]}:* (check the spider name, --prefix and "
            f"--redis-url)",
            file=sys.stderr,
        )
        return 1
    if args.watch is not None and args.watch <= 0:
        print(
            f"--watch {args.watch:g}: the refresh must be a positive number of seconds",
            file=sys.stderr,
        )
        return 2
    stop = _stop_on_ctrl_c() if args.watch is not None else None
    try:
        await _show(queue, args, stop)
    except asyncio.CancelledError:  # Ctrl-C: asyncio.run cancels the command; ends --watch
        if args.watch is None:
            raise
    finally:
        if stop is not None:
            _restore_ctrl_c()
    return 0


def _stop_on_ctrl_c() -> asyncio.Event:
    """An event Ctrl-C sets, for ``--watch``: it stops at the next refresh, and at once
    while it waits between two (the command's task is cancelled too, as asyncio.run does).

    Not the task's cancellation alone: on Python 3.11, a cancellation that lands as a
    Redis command's write completes is lost inside ``asyncio.wait_for`` (which redis-py
    uses to time writes; CPython issue gh-86296), and the watch would refresh on. A second
    Ctrl-C raises KeyboardInterrupt, as Python's own handler does."""
    stop = asyncio.Event()
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()

    def first_ctrl_c() -> None:
        stop.set()
        _restore_ctrl_c()
        if task is not None:
            task.cancel()

    with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
        loop.add_signal_handler(signal.SIGINT, first_ctrl_c)  # main thread, POSIX only
    return stop


def _restore_ctrl_c() -> None:
    with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
        asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)


async def _show(queue: RedisQueue, args: argparse.Namespace, stop: asyncio.Event | None) -> None:
    out = sys.stdout
    in_place = args.watch is not None and out.isatty() and not args.json
    if in_place:
        out.write(CLEAR_SCREEN)
    while stop is None or not stop.is_set():
        stats = await read_crawl_stats_async(queue.client, queue.keys, domains=args.domains > 0)
        paused = await paused_since(queue)
        health = await redis_health(queue.client)
        limits, held = await _politeness(queue)
        blooms, pressure = await _memory(queue)
        if args.json:
            doc = {**as_json(stats, args.domains), "paused": paused, "redis": health}
            doc["dupefilter"] = _dupefilter_json(blooms)
            doc["backpressure"] = pressure
            doc["domain_limits"] = {d: vars(lim) for d, lim in limits.items()}
            doc["domain_slots"] = held
            out.write(json.dumps(doc) + "\n")
        else:
            lines = text(stats, args.domains)
            if paused:
                lines.insert(1, f"{'paused':>13}  since {paused} (`scrapy-ha resume` to go on)")
            if limits:
                limited = stats.counter("domain_limited")
                lines.append(f"{'limits':>13}  {describe(limits, held)}; held back {limited:,}")
            lines += [_dupefilter_line(b) for b in blooms[:1]] + _pressure_lines(pressure)
            lines.append(f"{'redis':>13}  {'; '.join(health) or 'ok'}")
            _draw(out, lines, in_place=in_place, last=args.watch is None)
        out.flush()
        if args.watch is None or stop is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(args.watch):
                await stop.wait()


async def _politeness(queue: RedisQueue) -> tuple[dict[str, DomainLimit], dict[str, int]]:
    """The crawl-wide per-domain limits in force and the slots held (two small hashes)."""
    limits = limits_in_force(await queue.client.hgetall(queue.keys.domain_limits))
    held = held_slots(await queue.client.hgetall(queue.keys.polite)) if limits else {}
    return limits, held


async def _memory(queue: RedisQueue) -> tuple[list[BloomState], dict[str, int] | None]:
    """Each shard's Bloom filter (none: the exact set) and the back-pressure mark."""
    blooms = []
    for shard in shards_of(queue):
        state = bloom_state(await queue.client.hgetall(shard.keys.bloom))
        if state is not None:
            blooms.append(state)
    mark = await queue.client.get(queue.keys.pressure)
    return blooms, json.loads(mark) if mark else None


def _dupefilter_json(blooms: list[BloomState]) -> dict[str, Any]:
    if not blooms:
        return {"kind": "set"}
    return {
        "kind": "bloom",
        "urls": sum(b.urls for b in blooms),
        "layers": max(len(b.added) for b in blooms),
        "bytes": sum(b.bytes for b in blooms),
        "error_now": max(b.error_now for b in blooms),
        "error_bound": blooms[0].bound,
        "error_asked": blooms[0].asked,
        "expected_false_positives": sum(b.expected_false_positives for b in blooms),
    }


def _dupefilter_line(bloom: BloomState) -> str:
    """The Bloom filter (of shard 0 for a sharded crawl: each shard has one like it)."""
    per_url = bloom.bytes / bloom.urls if bloom.urls else 0.0
    return (
        f"{'dupefilter':>13}  bloom: {bloom.urls:,} URLs in {len(bloom.added)} layer(s), "
        f"{bloom.bytes / 2**20:,.1f} MB ({per_url:.1f} bytes a URL); error now "
        f"{bloom.error_now:.1e}, at most {bloom.bound:.1e} (asked {bloom.asked:g}); about "
        f"{bloom.expected_false_positives:,.1f} URL(s) never crawled (expected)"
    )


def _pressure_lines(mark: dict[str, int] | None) -> list[str]:
    if not mark:
        return []
    since = datetime.fromtimestamp(mark.get("since", 0) / 1000).astimezone()
    mb = {k: f"{mark.get(k, 0) / 2**20:,.1f} MB" for k in ("used", "max", "high", "low")}
    return [
        f"{'back-pressure':>13}  since {since:%H:%M:%S}: Redis uses {mb['used']} of "
        f"{mb['max']} (HA_REDIS_MEMORY_HIGH {mb['high']}): workers lease nothing new until "
        f"it falls below {mb['low']}; nothing is lost"
    ]


def _draw(out: TextIO, lines: list[str], *, in_place: bool, last: bool) -> None:
    if in_place:
        out.write(HOME + "".join(f"{line}{CLEAR_LINE}\n" for line in lines) + CLEAR_BELOW)
        return
    out.write("\n".join(lines) + "\n" + ("" if last else "\n"))


async def _crawl_exists(queue: RedisQueue) -> bool:
    """Whether any key of the crawl (checkpoints included) is in Redis."""
    if await queue.exists():
        return True
    return await CheckpointStore(queue.client, queue.keys).exists()


# -- JSON --------------------------------------------------------------------------------


def as_json(stats: CrawlStats, domains: int = TOP_DOMAINS) -> dict[str, Any]:
    """The status as one JSON object (stable keys: see docs/reference.md)."""
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
        "eta_seconds": _rounded(stats.eta_seconds(ETA_WINDOW)),
        "domains": [
            {"domain": d, **{e: counts.get(e, 0) for e in DOMAIN_EVENTS}}
            for d, counts in stats.top_domains(domains)
        ],
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


# -- text --------------------------------------------------------------------------------


def text(stats: CrawlStats, domains: int = TOP_DOMAINS) -> list[str]:
    """The status as lines of text, for a terminal."""
    when = datetime.fromtimestamp(stats.now_ms / 1000).astimezone()
    lines = [
        f"{stats.spider} at {when:%Y-%m-%d %H:%M:%S %Z}: {stats.workers} live worker(s)",
        _row(
            "state",
            pending=stats.pending,
            leased=stats.leased,
            delayed=stats.delayed,
            dead=stats.dead,
            fingerprints=stats.fingerprints,
        ),
        _row("totals", **{name: stats.counter(name) for name in COUNTERS[:5]}),
        _row("operator", requeued=stats.requeued, purged=stats.purged),
        _per_class("retried", stats.retried, stats.retried_by_class) + _success(stats),
        _per_class("dead-lettered", stats.dead_lettered, stats.dead_by_class),
        *(_rates(stats, event) for event in MINUTE_EVENTS),
        f"{'eta':>13}  {_eta(stats)}",
    ]
    return lines + _domains(stats, domains)


def _row(title: str, **values: int) -> str:
    return f"{title:>13}  " + "  ".join(f"{k} {v:,}" for k, v in values.items())


def _per_class(title: str, total: int, by_class: dict[str, int]) -> str:
    classes = ", ".join(f"{c} {n:,}" for c, n in sorted(by_class.items(), key=lambda x: -x[1]))
    return f"{title:>13}  {total:,}" + (f" ({classes})" if classes else "")


def _success(stats: CrawlStats) -> str:
    rate = stats.retry_success_rate
    if rate is None:
        return ""
    return f"; retry success {rate:.0%} ({stats.retry_ok:,} ok, {stats.retry_dead:,} dead)"


def _rates(stats: CrawlStats, event: str) -> str:
    rates = "  ".join(f"{stats.rate(event, m):,.1f} ({m}m)" for m in RATE_WINDOWS)
    return f"{event + '/min':>13}  {rates}"


def _eta(stats: CrawlStats) -> str:
    eta = stats.eta_seconds(ETA_WINDOW)
    if eta is None:
        return f"unknown: {stats.active:,} left, nothing acked in the last {ETA_WINDOW} minutes"
    if not stats.active:
        return "nothing left"
    return f"{duration(eta)} ({stats.active:,} left at the ack rate of the last {ETA_WINDOW}m)"


def duration(seconds: float) -> str:
    """``1h 02m``, ``4m 05s``, ``12s``."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s}s"


def _domains(stats: CrawlStats, n: int) -> list[str]:
    top = stats.top_domains(n)
    if not top:
        return []
    width = max(len(d) for d, _ in top)
    head = f"{'domain':<{width}}  " + "  ".join(f"{e:>9}" for e in DOMAIN_EVENTS)
    rows = [
        f"{d:<{width}}  " + "  ".join(f"{c.get(e, 0):>9,}" for e in DOMAIN_EVENTS) for d, c in top
    ]
    return [f"{'top domains':>13}", *(f"{'':>13}  {line}" for line in (head, *rows))]
