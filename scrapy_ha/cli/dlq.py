"""``scrapy-ha dlq list|show|export|requeue|purge SPIDER``: the dead-letter queue of a crawl
(every shard of a sharded one), filtered by class, domain, HTTP status, reason and time."""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from scrapy_ha.cli.archive import unarchived_kept
from scrapy_ha.cli.bulk import Approved, Progress, act, choose
from scrapy_ha.cli.common import approve, say_missing, say_unknown_class
from scrapy_ha.codec import mask_url
from scrapy_ha.codec.log_masking import one_line, visible
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.deadletters.marks import kept_by_purge
from scrapy_ha.deadletters.stream import Selection
from scrapy_ha.ops.display import local_time
from scrapy_ha.ops.operations import cleared_crawl_note, server_ms
from scrapy_ha.ops.shards import dead_letters

if TYPE_CHECKING:
    import argparse
    from collections.abc import AsyncIterator, Awaitable, Callable

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


async def _selection(dlq: DeadLetterQueue, args: argparse.Namespace) -> Selection:
    """The entries the filters of *args* select (see :class:`Selection`)."""
    now = await server_ms(dlq.client) if (args.since or args.until) else 0
    since = args.since(now) if args.since else None
    until = args.until(now) if args.until else None
    if since is not None and until is not None and since > until:  # a window of nothing
        raise ConfigError("--since is later than --until: nothing could match")
    return Selection(
        args.failure_class,
        args.domain,
        args.reason,
        args.status,
        since,
        until,
        getattr(args, "offset", 0),
        getattr(args, "limit", None),
    )


async def dlq_list(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Dead-letter entries, oldest first: id, when, class, HTTP status, attempts, reason, URL,
    then the total per class; filter by class, domain, status, reason and time; page with
    --limit/--offset. Read twice, a batch at a time: the records alone for the columns'
    widths, then the entries as they are printed."""
    dlq = dead_letters(queue)
    sel = await _selection(dlq, args)
    n, w, c = 0, 10, 12  # a worker's own ids: "<nonce>.<n>", 20 and more; a class of yours
    async for batch in dlq.batches(sel, requests=False):
        n += len(batch)
        w = max(w, *(len(e.id) for e in batch))
        c = max(c, *(len(visible(e.failure_class)) for e in batch))
    if not n:
        say_unknown_class(args.failure_class)
        print(
            f"dead-letter queue of {queue.keys.spider}: empty"
            + (" (for these filters)" if _filtered(args) or args.offset else "")
        )
        return 0
    c = min(CLASS_WIDTH, c)
    print(
        f"{'ID':>{w}}  {'WHEN':<19}  {'CLASS':<{c}} {'STATUS':>6} {'TRIES':>5}  {'REASON':<40}  URL"
    )
    by_class: Counter[str] = Counter()
    async for batch in dlq.batches(replace(sel, limit=n)):  # (those counted, not newer)
        for e in batch:
            print(
                f"{e.id:>{w}}  {local_time(e.dead_at)}  {_cut(e.failure_class, c):<{c}} "
                f"{e.status or '-':>6} {e.attempts:>5}  {_cut(e.reason, 40):<40}  "
                f"{one_line(mask_url(e.url))}"
            )
            by_class[e.failure_class] += 1
    classes = ", ".join(f"{one_line(fclass)} {n}" for fclass, n in sorted(by_class.items()))
    print(f"{_entries(by_class.total())} listed ({classes})")
    return 0


#: The options that select dead-letter entries by content or time.
#: The widest CLASS column: a longer class (HA_RETRY_STATUS_CLASSES names any) is cut.
CLASS_WIDTH = 24


def _cut(text: str, width: int) -> str:
    """*text* on one line (a reason may hold a traceback's newlines), cut to *width* once
    what a terminal would act on is escaped (escaped after the cut, it overflowed), never
    inside an escape (``\\u001b`` cut to ``\\u0``)."""
    line = visible(" ".join(text.split()))
    if len(line) <= width:
        return line
    end = width - 1
    escape = line.rfind("\\u", max(0, end - 5), end + 1)  # one cut in two reads as garbage:
    return line[: end if escape == -1 else escape] + "…"  # the whole of it goes


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
    """Every matching entry as one JSON object per line (url, class, reason, attempts, ...),
    printed as it is read, a batch at a time."""
    dlq = dead_letters(queue)
    found = False
    async for batch in dlq.batches(await _selection(dlq, args)):
        found = True
        for e in batch:
            print(json.dumps(e.as_dict()))
    if not found:
        say_unknown_class(args.failure_class)
    return 0


async def dlq_requeue(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Put entries back in the queue, attempts reset (IDs, or --all, or filters)."""
    dlq, requeued, without, lifted = dead_letters(queue), [0], [], [0]

    async def requeue(ids: list[str]) -> int:
        requeued[0] += (n := await dlq.requeue(ids))
        without.extend(dlq.without_request)  # (each batch's)
        lifted[0] += dlq.logins_lifted
        return n

    code = await _bulk(queue, args, "requeued", requeue)
    if requeued[0] and (note := await cleared_crawl_note(queue)):
        print(f"note: {note}", file=sys.stderr)
    if lifted[0]:
        print(
            f"note: lifted the hold of {lifted[0]} failed login(s) (login_once's check): the "
            "next page that meets the login form logs in",
            file=sys.stderr,
        )
    if not without:
        return code
    ids = " ".join(without)
    one = len(without) == 1
    print(
        f"dead letter {', '.join(without)}: "
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
    kept = [0]  # not archived yet: kept by the purge (a dry run's: would be)

    async def purge(ids: list[str]) -> int:
        n = await dlq.purge(ids)
        kept[0] += dlq.kept_unarchived  # (each batch's)
        return n

    async def keeps(entries: list[DeadEntry]) -> list[DeadEntry]:
        found = await kept_by_purge(dlq, entries)
        kept[0] += len(found)
        return found

    code = await _bulk(queue, args, "purged", purge, keeps if args.dry_run else None)
    if kept[0]:
        print(unarchived_kept(queue.keys.spider, kept[0], args.dry_run))
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
    given = [f"--{f.removeprefix('failure_')}" for f in FILTERS if getattr(args, f) is not None]
    if args.ids and (args.all or given):  # the IDs alone were taken: --all purged 1 of them
        raise ConfigError(
            f"name entry IDs or a selection ({', '.join(given or ['--all'])}), not both"
        )
    dlq = dead_letters(queue)
    approved = None if args.dry_run else Approved()
    try:
        if args.ids:
            entries, missing = await _by_ids(dlq, args.ids)
            chosen = await choose(_labelled(_once(entries), keeps), approved)
        else:
            missing = []
            # (a dry run names the first few by URL: the others' requests are not read)
            sel = await _selection(dlq, args)
            selected = dlq.batches(sel, requests=args.dry_run)
            chosen = await choose(_labelled(selected, keeps), approved)
            if not chosen.count:
                say_unknown_class(args.failure_class)
        say_missing("dead letter", missing, queue.keys.spider)
        verb = done.removesuffix("d")
        what = f"{_entries(chosen.count)} of {queue.keys.spider}"
        verdict = approve(args, verb, what, chosen.shown, chosen.count)
        if not verdict or approved is None:  # a dry run: 0, or 1 with an ID not found
            return int(bool(missing)) if verdict is None else 1
        n = await act(approved, action, Progress(f"{verb}:", chosen.count))
    finally:
        if approved is not None:
            await approved.drop()
    print(f"{done} {n:,} of {_entries(chosen.count)}")
    return 1 if missing else 0


async def _once(entries: list[DeadEntry]) -> AsyncIterator[list[DeadEntry]]:
    yield entries


async def _labelled(
    batches: AsyncIterator[list[DeadEntry]],
    keeps: Callable[[list[DeadEntry]], Awaitable[list[DeadEntry]]] | None,
) -> AsyncIterator[list[tuple[str, str]]]:
    """(id, label) of each entry of *batches*, but those *keeps* says the action would
    keep (a dry run's purge: those not archived yet)."""
    async for batch in batches:
        if keeps is not None and (kept := {e.id for e in await keeps(batch)}):
            batch = [e for e in batch if e.id not in kept]
        yield [(e.id, f"{e.id} {e.failure_class} {e.url}") for e in batch]
