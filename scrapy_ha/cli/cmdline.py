"""``scrapy-ha``: look at and operate a crawl's queue from the shell.

Redis is found from ``--redis-url`` (before or after the subcommand), else ``$REDIS_URL``,
else the Scrapy project's settings (``REDIS_URL``, ``REDIS_PARAMS``... when run inside a
project), else ``redis://localhost:6379/0``. The settings of a command on one spider are
those its workers have: the project's, the spider's ``custom_settings``, the add-ons'
(:mod:`scrapy_ha.cli.project`). Each subcommand lives in this module or in a module of its
own in :mod:`scrapy_ha.cli`; :func:`build_parser` registers them all.
"""

from __future__ import annotations

__all__ = ["build_parser", "main", "parse"]

import argparse
import asyncio
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from scrapy.settings import Settings

from scrapy_ha._version import __version__
from scrapy_ha.cli import checkpoints, dashboard, delayed, pause, push, workers
from scrapy_ha.cli.archive import add_archive_command, unarchived_kept
from scrapy_ha.cli.common import Command, add_bulk_options, approve, command, group, parse_when
from scrapy_ha.cli.project import worker_view
from scrapy_ha.cli.report import add_report_command
from scrapy_ha.cli.status import add_status_arguments, status
from scrapy_ha.codec import mask_url
from scrapy_ha.codec.masking import install_log_masking, masked_output
from scrapy_ha.config.memory import MemoryConfig
from scrapy_ha.config.scheduler import DEFAULT_CONNECT_TIMEOUT, key_prefix
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.keys import DEFAULT_PREFIX
from scrapy_ha.ops import metrics
from scrapy_ha.ops.display import local_time
from scrapy_ha.ops.operations import server_ms
from scrapy_ha.ops.shards import crawl_queue, dead_letters, refuse_unaware
from scrapy_ha.store.connection import (
    RedisUnavailable,
    check_reachable,
    display_url,
    redis_from_settings,
)
from scrapy_ha.store.sharding import check_shard_count, set_dupefilter, shard_setting
from scrapy_ha.store.url import RedisConfigError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from scrapy_ha.deadletters.dlq import DeadEntry, DeadLetterQueue
    from scrapy_ha.store.queue import RedisQueue

#: The environment variable that gives the Redis URL when ``--redis-url`` is not given
#: (the name scrapy-redis's own setting has, so one export serves both).
REDIS_URL_ENV = "REDIS_URL"


def _settings(args: argparse.Namespace) -> Settings:
    try:
        from scrapy.utils.project import get_project_settings

        settings = get_project_settings()
    except Exception:  # not in a project: plain defaults
        settings = Settings()
    url = args.redis_url or os.environ.get(REDIS_URL_ENV)
    if url:
        settings.set("REDIS_URL", url, priority="cmdline")
    return settings


async def _run(args: argparse.Namespace) -> int:
    view = worker_view(_settings(args), args.spider)
    args.worker_view = view  # for push: the worker's fingerprints, shards and codec
    settings = view.crawler.settings
    prefix = args.prefix or key_prefix(settings)
    try:
        client = redis_from_settings(settings, connect_timeout=DEFAULT_CONNECT_TIMEOUT)
    except RedisConfigError:
        raise  # names the URL and the fix already
    except ValueError as exc:  # redis-py cannot parse the URL
        raise ConfigError(
            f"bad Redis URL {display_url(settings)}: {exc} (give --redis-url or REDIS_URL as "
            f"redis://[:password@]host:port/db)"
        ) from None
    try:
        await check_reachable(client, display_url(settings), DEFAULT_CONNECT_TIMEOUT)
        func: Command = args.func
        queue = await crawl_queue(client, prefix, args.spider, _shards_given(args, settings))
        refuse_unaware(queue, func.__name__, _words(args))
        if func.__name__ == "push":  # the first writer of a crawl stores its shard count
            await check_shard_count(queue)
            await set_dupefilter(queue, MemoryConfig.from_settings(settings))
        return await func(queue, args)
    finally:
        await client.aclose()


def _shards_given(args: argparse.Namespace, settings: Settings) -> int | None:
    """``--shards``, else the project's ``HA_SHARDS`` if set (None: read from Redis)."""
    if getattr(args, "shards", None) is not None:
        settings.set("HA_SHARDS", args.shards, priority="cmdline")
    return shard_setting(settings) if settings.get("HA_SHARDS") is not None else None


def _words(args: argparse.Namespace) -> str:
    action = getattr(args, args.command, None)  # a group's subcommand (``dlq list``)
    return f"{args.command} {action}" if isinstance(action, str) else args.command


async def _crawl_exists(queue: RedisQueue) -> bool:
    """Whether any key of the crawl (checkpoints included) is in Redis."""
    if await queue.exists():
        return True
    return await checkpoints.store(queue).exists()


async def flush(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Delete every key of the crawl (dead-letter queue included); refuses while workers live."""
    counts = await queue.counts()
    if counts.workers and not args.force:
        print(
            f"{counts.workers} worker(s) of {queue.keys.spider} are alive: stop them first, "
            f"or pass --force",
            file=sys.stderr,
        )
        return 1
    held = [f"{name}: {n}" for name, n in counts.as_dict().items() if n]
    verdict = approve(args, "flush", f"every key of {queue.keys.spider}", held or ["(no keys)"])
    if not verdict:
        return 0 if verdict is None else 1
    await queue.flush()
    print(f"flushed {queue.keys.spider}")
    return 0


async def _selected(dlq: DeadLetterQueue, args: argparse.Namespace) -> list[DeadEntry]:
    if getattr(args, "ids", None):
        found = [await dlq.get(i) for i in args.ids]
        return [e for e in found if e is not None]
    now = await server_ms(dlq.client) if (args.since or args.until) else 0
    return await dlq.entries(
        failure_class=args.failure_class,
        domain=args.domain,
        reason=args.reason,
        status=args.status,
        since_ms=args.since(now) if args.since else None,
        until_ms=args.until(now) if args.until else None,
        offset=getattr(args, "offset", 0),
        limit=getattr(args, "limit", None),
    )


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
    print(
        f"{'ID':>10}  {'WHEN':<19}  {'CLASS':<12} {'STATUS':>6} {'TRIES':>5}  {'REASON':<40}  URL"
    )
    for e in entries:
        print(
            f"{e.id:>10}  {local_time(e.dead_at)}  {e.failure_class:<12} "
            f"{e.status or '-':>6} {e.attempts:>5}  {e.reason[:40]:<40}  {mask_url(e.url)}"
        )
    by_class: dict[str, int] = {}
    for e in entries:
        by_class[e.failure_class] = by_class.get(e.failure_class, 0) + 1
    classes = ", ".join(f"{fclass} {n}" for fclass, n in sorted(by_class.items()))
    print(f"{_entries(len(entries))} listed ({classes})")
    return 0


#: The options that select dead-letter entries by content or time.
FILTERS = ("failure_class", "domain", "reason", "status", "since", "until")


def _filtered(args: argparse.Namespace) -> bool:
    return any(getattr(args, name, None) is not None for name in (*FILTERS, "limit"))


def _entries(n: int) -> str:
    return f"{n} entr{'y' if n == 1 else 'ies'}"


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
    return await _bulk(queue, args, "requeued", dead_letters(queue).requeue)


async def dlq_purge(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Delete entries for good (IDs, or --all, or filters); with an SQL archive, only those
    archived already."""
    dlq = dead_letters(queue)
    code = await _bulk(queue, args, "purged", dlq.purge)
    if dlq.kept_unarchived:
        print(unarchived_kept(queue.keys.spider, dlq.kept_unarchived))
    return code


async def _bulk(
    queue: RedisQueue,
    args: argparse.Namespace,
    done: str,
    action: Callable[[list[str]], Awaitable[int]],
) -> int:
    if not (args.ids or args.all or any(getattr(args, f) is not None for f in FILTERS)):
        print(
            "name entry IDs, a filter (--class, --domain, --status, --reason, --since, "
            "--until) or --all",
            file=sys.stderr,
        )
        return 1
    entries = await _selected(dead_letters(queue), args)
    verb = done.removesuffix("d")
    what = f"{_entries(len(entries))} of {queue.keys.spider}"
    verdict = approve(args, verb, what, [f"{e.id} {e.failure_class} {e.url}" for e in entries])
    if not verdict:
        return 0 if verdict is None else 1
    n = await action([e.id for e in entries])
    print(f"{done} {n} of {_entries(len(entries))}")
    return 0


_command = command


def _add_filters(p: argparse.ArgumentParser, *, ids: bool = False, limit: bool = False) -> None:
    if ids:
        p.add_argument("ids", nargs="*", metavar="ID", help="entry ids (see `dlq list`)")
        p.add_argument("--all", action="store_true", help="every entry")
    p.add_argument("--class", dest="failure_class", help="failure class: gone, banned, server, ...")
    p.add_argument("--domain", help="the request's host name")
    p.add_argument("--status", type=int, help="the HTTP status of the last attempt: 404, 503, ...")
    p.add_argument("--reason", help="a part of the reason (case-insensitive)")
    p.add_argument(
        "--since", type=_when("--since"), help="dead-lettered since: 24h, 30m, 7d, or a local time"
    )
    p.add_argument(
        "--until", type=_when("--until"), help="dead-lettered until: 1h, or 2026-11-30 17:05"
    )
    if limit:
        p.add_argument("--limit", type=int, help="at most this many")
        p.add_argument("--offset", type=int, default=0, help="skip this many matches first")


def _when(option: str) -> Callable[[str], Callable[[int], int]]:
    """An argparse type: checks a time at parse time, resolves it against Redis's clock."""

    def parse(text: str) -> Callable[[int], int]:
        parse_when(text, 0, option=option)  # a bad value is a usage error, before connecting
        return lambda now_ms: parse_when(text, now_ms, option=option)

    return parse


def _add_dlq(sub: Any) -> None:
    dlq = group(sub, "dlq", "the dead-letter queue")
    _add_filters(_command(dlq, "list", dlq_list), limit=True)
    _command(dlq, "show", dlq_show).add_argument("id")
    _add_filters(_command(dlq, "export", dlq_export), limit=True)
    for name, func in (("requeue", dlq_requeue), ("purge", dlq_purge)):
        bulk = _command(dlq, name, func)
        _add_filters(bulk, ids=True, limit=True)
        add_bulk_options(bulk)
    add_archive_command(dlq, _command)


def build_parser() -> argparse.ArgumentParser:
    """The ``scrapy-ha`` command line: each subcommand's parser carries its function."""
    parser = argparse.ArgumentParser(prog="scrapy-ha", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--redis-url",
        help="redis://, rediss://, unix://, redis+sentinel:// or redis+cluster:// URL "
        f"(default: ${REDIS_URL_ENV}, else the project's REDIS_URL, REDIS_SENTINELS or "
        "REDIS_CLUSTER_NODES); accepted after the subcommand too",
    )
    parser.add_argument("--prefix", help=f"key prefix (default: HA_KEY_PREFIX or {DEFAULT_PREFIX})")
    parser.add_argument(
        "--shards",
        type=int,
        help="the crawl's HA_SHARDS (default: the count the crawl stored in Redis)",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_status_arguments(_command(sub, "status", status))
    flush_ = _command(sub, "flush", flush)
    flush_.add_argument("--force", action="store_true", help="even while workers are alive")
    add_bulk_options(flush_)
    workers.register(sub)
    push.register(sub)
    pause.register(sub)
    delayed.register(sub)
    _add_dlq(sub)
    checkpoints.register(sub)
    add_report_command(sub, _command)
    metrics.add_command(sub)
    dashboard.add_command(sub)
    return parser


#: Positional lists (``ID...``, ``TASK...``) that may also come after options.
TRAILING_LISTS = ("ids", "tasks")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, IDs accepted after options too (``purge books --yes 17 18``:
    argparse alone binds an empty ID list at the first option)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    dest = next((d for d in TRAILING_LISTS if isinstance(getattr(args, d, None), list)), None)
    if extra and dest and not any(e.startswith("-") for e in extra):
        setattr(args, dest, [*getattr(args, dest), *extra])
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run a command; everything it prints or logs is masked (:mod:`scrapy_ha.codec.masking`)."""
    install_log_masking()
    with masked_output():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    args = parse(argv)
    try:
        if args.command == "metrics":  # a server of its own, not a command on one crawl
            return int(args.serve(args, _settings(args)))
        return asyncio.run(_run(args))
    except (RedisUnavailable, RedisConfigError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
