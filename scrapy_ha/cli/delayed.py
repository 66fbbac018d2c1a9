"""``scrapy-ha delayed list`` / ``delayed retry-now``: retries waiting for their time, and
requests held back without an attempt (a closed domain gate, a domain's limits).

A retry waits in the crawl's ``delayed`` sorted set (score: its due time, Redis ms) until a
worker's sync promotes it to pending. ``retry-now`` sets the due time of the chosen entries
to now (``ZADD XX``: an entry promoted meanwhile is not added back): the next sync of any
worker promotes them, with the priority and place they would have had.
"""

from __future__ import annotations

import sys
from collections import Counter
from contextlib import aclosing
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from scrapy_ha import metakeys
from scrapy_ha.cli.bulk import Approved, Progress, act, choose
from scrapy_ha.cli.common import approve, plural, say_missing, say_unknown_class
from scrapy_ha.codec import describe, mask_url
from scrapy_ha.codec.document import META
from scrapy_ha.ops import operations
from scrapy_ha.ops.display import humanize, local_time, time_ms
from scrapy_ha.ops.operations import server_ms
from scrapy_ha.ops.waiting import HELD_KINDS
from scrapy_ha.store.payloads import read_payloads
from scrapy_ha.store.sharding import shards_of
from scrapy_ha.store.shards import ShardedQueue, outside
from scrapy_ha.store.zpaging import by_score

if TYPE_CHECKING:
    import argparse
    from collections.abc import AsyncGenerator

    from scrapy_ha.store.queue import RedisQueue

#: Entries read per round trip.
BATCH = 500


@dataclass(frozen=True)
class Delayed:
    """One delayed retry: its id, due time (Redis ms), failure class, attempts, URL."""

    id: str
    due_ms: int
    failure_class: str
    attempts: int
    url: str

    @property
    def domain(self) -> str:
        return urlsplit(self.url).hostname or ""


def _parse(entry_id: str, due: float, payload: bytes | None, held: bytes | None) -> Delayed:
    """A delayed entry: a retry has the class of its last attempt, a request that waits
    without an attempt ``gate`` or ``limit`` (why it waits: see ``store/lua/lib/held.lua``)."""
    summary = describe(payload)
    meta = summary.document.get(META)
    meta = meta if isinstance(meta, dict) else {}
    retries = meta.get(metakeys.RETRIES)
    attempts = (
        sum(v for v in retries.values() if isinstance(v, int)) if isinstance(retries, dict) else 0
    )
    fclass = summary.last_class
    why = (held or b"").split(b" ", 1)[0].decode(errors="backslashreplace")
    fclass = why if why in HELD_KINDS else fclass
    return Delayed(entry_id, time_ms(due), str(fclass or "-"), attempts, summary.url_or())


async def entries(queue: RedisQueue) -> list[Delayed]:
    """Every delayed entry, soonest due first (of every shard of a sharded crawl, ids as the
    workers see them)."""
    return [d async for d in in_order(queue)]


async def in_order(queue: RedisQueue) -> AsyncGenerator[Delayed]:
    """Every delayed entry, soonest due first, every shard's merged (ids as the workers see
    them), read *BATCH* at a time per shard: a listing of the first few of a continuous
    crawl's million revisits reads a batch, not the whole set."""
    streams = [_outside(i, shard) for i, shard in enumerate(shards_of(queue))]
    heads: dict[int, Delayed] = {}
    try:
        for i, stream in enumerate(streams):
            if (first := await anext(stream, None)) is not None:
                heads[i] = first
        while heads:  # the soonest head next (the lower shard first, as a sort put them)
            i = min(heads, key=lambda k: (heads[k].due_ms, k))
            yield heads.pop(i)
            if (following := await anext(streams[i], None)) is not None:
                heads[i] = following
    finally:
        for stream in streams:
            await stream.aclose()


async def _outside(shard: int, queue: RedisQueue) -> AsyncGenerator[Delayed]:
    async for d in _shard_entries(queue):
        yield d if shard == 0 else replace(d, id=outside(shard, d.id))


async def _shard_entries(queue: RedisQueue) -> AsyncGenerator[Delayed]:
    """One shard's delayed entries, soonest due first, each batch read by score after the
    last one read (``zpaging.by_score``): entries promoted meanwhile move no other."""
    async for rows in by_score(queue.client, queue.keys.delayed, batch=BATCH):
        ids = [r[0].decode() if isinstance(r[0], bytes) else str(r[0]) for r in rows]
        for d in await _read(queue, ids, [score for _, score in rows]):
            yield d


async def _read(queue: RedisQueue, ids: list[str], scores: list[float]) -> list[Delayed]:
    """The delayed entries *ids* of one shard, due at *scores*."""
    if not ids:
        return []
    payloads = await read_payloads(queue.client, queue.keys, ids)
    marks = await queue.client.hmget(queue.keys.held, ids)
    return [_parse(*row) for row in zip(ids, scores, payloads, marks, strict=True)]


async def named(queue: RedisQueue, ids: list[str]) -> list[Delayed]:
    """The delayed entries of *ids* (as the workers see them) still delayed, soonest due
    first: read by id, whatever the size of the delayed set."""
    by_shard: dict[int, list[str]] = {}
    for entry_id in dict.fromkeys(ids):
        shard, local = queue.route(entry_id) if isinstance(queue, ShardedQueue) else (0, entry_id)
        by_shard.setdefault(shard, []).append(local)
    found: list[Delayed] = []
    shards = shards_of(queue)
    for shard, local_ids in by_shard.items():
        if shard >= len(shards):
            continue
        for start in range(0, len(local_ids), BATCH):
            chunk = local_ids[start : start + BATCH]
            scores = await shards[shard].client.zmscore(shards[shard].keys.delayed, chunk)
            kept = [(i, s) for i, s in zip(chunk, scores, strict=True) if s is not None]
            read = await _read(shards[shard], [i for i, _ in kept], [s for _, s in kept])
            found += [d if shard == 0 else replace(d, id=outside(shard, d.id)) for d in read]
    return sorted(found, key=lambda d: d.due_ms)


def _wanted(d: Delayed, args: argparse.Namespace) -> bool:
    """Whether *d* matches the filters given (--class, --domain)."""
    return (args.failure_class is None or d.failure_class == args.failure_class) and (
        args.domain is None or d.domain == args.domain
    )


def _matching(found: list[Delayed], args: argparse.Namespace) -> list[Delayed]:
    ids = set(getattr(args, "ids", None) or [])
    chosen = [d for d in found if (not ids or d.id in ids) and _wanted(d, args)]
    if not chosen:
        say_unknown_class(args.failure_class)
    return chosen


async def delayed_list(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Retries waiting for their time, soonest first: id, due (local time, and in how
    long), failure class, attempts so far, URL. Printed as they are read, a batch at a
    time: ``--limit`` reads what it lists (and the entries its filters pass over)."""
    now = await server_ms(queue.client)
    listed: Counter[str] = Counter()
    async with aclosing(in_order(queue)) as found:
        async for d in found:
            if not _wanted(d, args):
                continue
            if not listed:
                print(f"{'ID':>10}  {'DUE':<19} {'IN':>8}  {'CLASS':<12} {'TRIES':>5}  URL")
            _print_row(d, now)
            listed[_kind(d)] += 1
            if listed.total() == args.limit:
                break
    if not listed:
        say_unknown_class(args.failure_class)
        print(f"no delayed request of {queue.keys.spider}")
        return 0
    n = listed.total()
    print(f"{plural(n, 'delayed request', 'delayed requests')} listed ({kinds(listed)})")
    return 0


def _print_row(d: Delayed, now: int) -> None:
    wait = "due" if d.due_ms <= now else humanize((d.due_ms - now) / 1000)
    print(
        f"{d.id:>10}  {local_time(d.due_ms) or '-':<19} {wait:>8}  {d.failure_class:<12} "
        f"{d.attempts:>5}  {mask_url(d.url)}"
    )


#: How the listing's last line counts each kind of delayed request.
KINDS = {
    "retry": ("retry", "retries"),
    "revisit": ("revisit", "revisits"),
    "gate": ("held by a gate", "held by a gate"),
    "limit": ("held by a limit", "held by a limit"),
    "proxy": ("waiting for a proxy", "waiting for a proxy"),
    "dictionary": ("waiting for its dictionary", "waiting for their dictionary"),
}


def _kind(d: Delayed) -> str:
    """A retry's class is its last failure's; the others wait without an attempt."""
    return d.failure_class if d.failure_class in HELD_KINDS else "retry"


def kinds(counts: Counter[str]) -> str:
    """``3 retries, 2 revisits``: the listed requests by kind (see :func:`_kind`)."""
    return ", ".join(plural(counts[k], *KINDS[k]) for k in KINDS if counts[k])


async def delayed_retry_now(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Make delayed requests due now (IDs, --all, --class, --domain): the next sync of any
    worker promotes them to the queue. A selection is read a batch at a time and what the
    prompt approved is acted on (see :mod:`.bulk`)."""
    if not (args.ids or args.all or args.failure_class or args.domain):
        print("name entry IDs, a filter (--class, --domain) or --all", file=sys.stderr)
        return 1
    approved = None if args.dry_run else Approved()
    try:
        missing: list[str] = []
        if args.ids and not (args.all or args.failure_class or args.domain):
            named_ = _matching(await named(queue, args.ids), args)  # read by id, not the set
            found = {d.id for d in named_}
            missing = [i for i in dict.fromkeys(args.ids) if i not in found]
            chosen = await choose(_labelled(_once(named_)), approved)
        else:
            seen: set[str] = set()  # (of the ids given with a filter)
            chosen = await choose(_labelled(_selected(queue, args, seen)), approved)
            missing = [i for i in dict.fromkeys(args.ids or []) if i not in seen]
            if not chosen.count:
                say_unknown_class(args.failure_class)
        say_missing("delayed request", missing, queue.keys.spider)
        n = chosen.count
        what = f"{plural(n, 'delayed request', 'delayed requests')} of {queue.keys.spider}"
        verdict = approve(args, "retry now", what, chosen.shown, n)
        if not verdict or approved is None:  # a dry run: 0, or 1 with an ID not found
            return int(bool(missing)) if verdict is None else 1
        changed = await act(approved, partial(operations.make_due, queue), Progress("due:", n))
    finally:
        if approved is not None:
            await approved.drop()
    print(f"made {changed:,} of {what} due now: workers take them at their next sync")
    return 1 if missing else 0


async def _once(found: list[Delayed]) -> AsyncGenerator[list[Delayed]]:
    yield found


async def _selected(
    queue: RedisQueue, args: argparse.Namespace, seen: set[str]
) -> AsyncGenerator[list[Delayed]]:
    """The delayed entries of --all, --class, --domain (and the ids given with them: those
    chosen go in *seen*), soonest due first, *BATCH* at a time."""
    ids = set(getattr(args, "ids", None) or [])
    batch: list[Delayed] = []
    async with aclosing(in_order(queue)) as found:
        async for d in found:
            if (not ids or d.id in ids) and _wanted(d, args):
                batch.append(d)
                seen.update(ids & {d.id})
            if len(batch) >= BATCH:
                yield batch
                batch = []
    if batch:
        yield batch


async def _labelled(
    batches: AsyncGenerator[list[Delayed]],
) -> AsyncGenerator[list[tuple[str, str]]]:
    async for batch in batches:
        yield [(d.id, f"{d.id} {d.failure_class} {mask_url(d.url)}") for d in batch]
