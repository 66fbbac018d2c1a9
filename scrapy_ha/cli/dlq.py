"""``scrapy-ha dlq list|show|export|requeue|purge SPIDER``: the dead-letter queue of a crawl
(every shard of a sharded one), filtered by class, domain, HTTP status, reason and time."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from scrapy_ha.cli.archive import unarchived_kept
from scrapy_ha.cli.common import approve, say_missing, say_unknown_class
from scrapy_ha.codec import mask_url
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.deadletters.marks import kept_by_purge
from scrapy_ha.ops.display import local_time
from scrapy_ha.ops.operations import cleared_crawl_note, server_ms
from scrapy_ha.ops.shards import dead_letters

if TYPE_CHECKING:
    import argparse
    from collections.abc import Awaitable, Callable

    from scrapy_ha.deadletters.dlq import DeadEntry, DeadLetterQueue
    from scrapy_ha.store.queue import RedisQueue


async def _by_ids(dlq: DeadLetterQueue, ids: list[str]) -> tuple[list[DeadEntry], list[str]]:
    """The entries of *ids* (each once, however written), and the ids not found."""
    found: dict[str, DeadEntry] = {}
    missing = []
    for given in dict.fromkeys(ids):
        entry = await dlq.get(given)
        if entry is None:
            missing.append(given)
        else:
            found.setdefault(entry.id, entry)
    return list(found.values()), missing


async def _selected(dlq: DeadLetterQueue, args: argparse.Namespace) -> list[DeadEntry]:
    if getattr(args, "ids", None):
        return (await _by_ids(dlq, args.ids))[0]
    now = await server_ms(dlq.client) if (args.since or args.until) else 0
    since = args.since(now) if args.since else None
    until = args.until(now) if args.until else None
    if since is not None and until is not None and since > until:  # a window of nothing
        raise ConfigError("--since is later than --until: nothing could match")
    found = await dlq.entries(
        failure_class=args.failure_class,
        domain=args.domain,
        reason=args.reason,
        status=args.status,
        since_ms=since,
        until_ms=until,
        offset=getattr(args, "offset", 0),
        limit=getattr(args, "limit", None),
    )
    if not found:
        say_unknown_class(args.failure_class)
    return found


async def dlq_list(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Dead-letter entries, oldest first: id, when, class, HTTP status, attempts, reason, URL,
    then the total per class; filter by class, domain, status, reason and time; page with
    --limit/--offset."""
    entries = await _selected(dead_letters(queue), args)
    if not entries:
        print(
            f"dead-letter queue of {queue.keys.spider}: empty"
            + (" (for these filters)" if _filtered(args) or args.offset else "")
        )
        return 0
    w = max(10, *(len(e.id) for e in entries))  # a worker's own ids: "<nonce>.<n>", 20 and more
    c = min(CLASS_WIDTH, max(12, *(len(e.failure_class) for e in entries)))  # a class of yours
    print(
        f"{'ID':>{w}}  {'WHEN':<19}  {'CLASS':<{c}} {'STATUS':>6} {'TRIES':>5}  {'REASON':<40}  URL"
    )
    for e in entries:
        print(
            f"{e.id:>{w}}  {local_time(e.dead_at)}  {_cut(e.failure_class, c):<{c}} "
            f"{e.status or '-':>6} {e.attempts:>5}  {_cut(e.reason, 40):<40}  {mask_url(e.url)}"
        )
    by_class: dict[str, int] = {}
    for e in entries:
        by_class[e.failure_class] = by_class.get(e.failure_class, 0) + 1
    classes = ", ".join(f"{fclass} {n}" for fclass, n in sorted(by_class.items()))
    print(f"{_entries(len(entries))} listed ({classes})")
    return 0


#: The options that select dead-letter entries by content or time.
#: The widest CLASS column: a longer class (HA_RETRY_STATUS_CLASSES names any) is cut.
CLASS_WIDTH = 24


def _cut(text: str, width: int) -> str:
    """*text* on one line (a reason may hold a traceback's newlines), cut to *width*."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


FILTERS = ("failure_class", "domain", "reason", "status", "since", "until")


def _filtered(args: argparse.Namespace) -> bool:
    return any(getattr(args, name, None) is not None for name in (*FILTERS, "limit"))


def _entries(n: int) -> str:
    return f"{n:,} entr{'y' if n == 1 else 'ies'}"


async def dlq_show(queue: RedisQueue, args: argparse.Namespace) -> int:
    """One entry in full, as JSON (the request, class, reason, history); the body as text
    (JSON bodies as JSON), other bytes escaped."""
    entry = await dead_letters(queue).get(args.id)
    if entry is None:
        print(f"no dead-letter entry {args.id} in {queue.keys.spider}", file=sys.stderr)
        return 1
    kind, body = entry.body()
    shown = {**entry.as_dict(), "request": entry.summary.printable()}
    shown.update(_local_times(shown))
    if kind != "none":
        shown.update(body=body, body_format=kind)
    print(json.dumps(shown, indent=2, ensure_ascii=False))
    return 0


def _local_times(shown: dict[str, Any]) -> dict[str, Any]:
    """``dead_at``, ``first``, ``last`` and each attempt's ``t`` as local date-times (the
    stored ms stay in ``export``, for scripts)."""
    times: dict[str, Any] = {
        k: local_time(v) for k, v in shown.items() if k in _TIMES and isinstance(v, int)
    }
    history = shown.get("history")
    if isinstance(history, list):
        times["history"] = [
            {**h, "t": local_time(h["t"])}
            if isinstance(h, dict) and isinstance(h.get("t"), int)
            else h
            for h in history
        ]
    return times


#: The fields of a dead-letter entry that hold a time (Redis ms).
_TIMES = ("dead_at", "first", "last")


async def dlq_export(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Every matching entry as one JSON object per line (url, class, reason, attempts, ...)."""
    for e in await _selected(dead_letters(queue), args):
        print(json.dumps(e.as_dict()))
    return 0


async def dlq_requeue(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Put entries back in the queue, attempts reset (IDs, or --all, or filters)."""
    dlq, requeued = dead_letters(queue), [0]

    async def requeue(ids: list[str]) -> int:
        requeued[0] += (n := await dlq.requeue(ids))
        return n

    code = await _bulk(queue, args, "requeued", requeue)
    if requeued[0] and (note := await cleared_crawl_note(queue)):
        print(f"note: {note}", file=sys.stderr)
    if not dlq.without_request:
        return code
    ids = " ".join(dlq.without_request)
    one = len(dlq.without_request) == 1
    print(
        f"dead letter {', '.join(dlq.without_request)}: "
        + ("its stored request is" if one else "their stored requests are")
        + " gone (deleted from Redis?), so "
        + ("it cannot be requeued and stays" if one else "they cannot be requeued and stay")
        + f" listed; `scrapy-ha dlq purge {queue.keys.spider} {ids}` removes "
        + ("it" if one else "them"),
        file=sys.stderr,
    )
    return 1


async def dlq_purge(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Delete entries for good (IDs, or --all, or filters); with an SQL archive, only those
    archived already."""
    dlq = dead_letters(queue)
    kept: list[DeadEntry] = []

    async def keeps(entries: list[DeadEntry]) -> list[DeadEntry]:
        kept[:] = await kept_by_purge(dlq, entries)  # (a dry run's: what the purge keeps)
        return kept

    code = await _bulk(queue, args, "purged", dlq.purge, keeps if args.dry_run else None)
    if dlq.kept_unarchived or kept:
        print(unarchived_kept(queue.keys.spider, dlq.kept_unarchived or len(kept), args.dry_run))
    return code


async def _bulk(
    queue: RedisQueue,
    args: argparse.Namespace,
    done: str,
    action: Callable[[list[str]], Awaitable[int]],
    keeps: Callable[[list[DeadEntry]], Awaitable[list[DeadEntry]]] | None = None,
) -> int:
    """Select the entries (IDs or filters), ask, and run *action* on them; a dry run names
    them, but those *keeps* says the action would keep (a purge's not archived yet)."""
    if not (args.ids or args.all or any(getattr(args, f) is not None for f in FILTERS)):
        print(
            "name entry IDs, a filter (--class, --domain, --status, --reason, --since, "
            "--until) or --all",
            file=sys.stderr,
        )
        return 1
    chosen = [f"--{f.removeprefix('failure_')}" for f in FILTERS if getattr(args, f) is not None]
    if args.ids and (args.all or chosen):  # the IDs alone were taken: --all purged 1 of them
        raise ConfigError(
            f"name entry IDs or a selection ({', '.join(chosen or ['--all'])}), not both"
        )
    missing: list[str] = []
    if args.ids:
        entries, missing = await _by_ids(dead_letters(queue), args.ids)
    else:
        entries = await _selected(dead_letters(queue), args)
    say_missing("dead letter", missing, queue.keys.spider)
    if keeps is not None and (kept := {e.id for e in await keeps(entries)}):
        entries = [e for e in entries if e.id not in kept]
    verb = done.removesuffix("d")
    what = f"{_entries(len(entries))} of {queue.keys.spider}"
    verdict = approve(args, verb, what, [f"{e.id} {e.failure_class} {e.url}" for e in entries])
    if not verdict:  # a dry run: 0, or 1 with an ID not found
        return int(bool(missing)) if verdict is None else 1
    n = await action([e.id for e in entries])
    print(f"{done} {n:,} of {_entries(len(entries))}")
    return 1 if missing else 0
