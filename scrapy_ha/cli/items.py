"""``scrapy-ha items SPIDER --to SINK``: store the crawl's items exactly once (see
:mod:`scrapy_ha.sinks`), from its item stream (``HA_ITEMS = "outbox"``).

SINK is ``jsonl:PATH`` (a JSON Lines file, with its offset file ``PATH.offset``), a
SQLAlchemy URL (``sqlite:///items.db``, ``postgresql+psycopg://user:pw@host/db``: the table
``--table``), or ``pipelines`` (the project's ``HA_ITEMS_PIPELINES``, else its
``ITEM_PIPELINES``; run it in the project's directory). Each sink is a consumer group of
its own (``--group``; by default named after the sink, so that consumers of one database
share the work and two files each get every item); start as many consumers of one group as
you like. Declare every sink before the crawl (``--declare`` creates its group and exits): an
entry leaves the stream once every group has it, so a group created later misses what was
trimmed before. It runs until Ctrl-C or SIGTERM (the batch under way is finished; a second
one gives it up: it is delivered again), or with ``--exit-idle`` once the crawl has ended and
every item is in the sink. Started while its Redis is not reachable, it waits for it as a
worker does (:mod:`.items_start`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

import redis

from scrapy_ha.cli.common import CTRL_C, INTERRUPTED
from scrapy_ha.cli.items_grammar import ITEM_SINKS
from scrapy_ha.codec import mask_url
from scrapy_ha.config.items import items_mode
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.sinks.consumer import GroupGone, ItemConsumer, SinkDidNotOpen, default_consumer
from scrapy_ha.sinks.jsonl import JsonLinesSink
from scrapy_ha.sinks.pipelines import PipelinesSink
from scrapy_ha.sinks.sql import SqlSink
from scrapy_ha.store.sharding import shards_of
from scrapy_ha.store.wire import text

if TYPE_CHECKING:
    import argparse
    from collections.abc import Coroutine

    from scrapy_ha.sinks.consumer import Sink
    from scrapy_ha.store.queue import RedisQueue

__all__ = ["in_loop", "items"]


def _sink(args: argparse.Namespace, spider: str) -> tuple[Sink, str, str]:
    """The sink ``--to`` names, its default group and its default consumer name."""
    to: str = args.to
    if to.startswith("jsonl:"):
        path = to[len("jsonl:") :]
        if not path or os.path.isdir(path):  # checked before its group is made in Redis
            raise ConfigError(f"--to {to}: name a file after jsonl: (not a directory)")
        jsonl = JsonLinesSink(path)
        return jsonl, f"jsonl:{jsonl.path}", jsonl.consumer
    if to == "pipelines":
        view = args.worker_view
        if view.caveat:
            raise ConfigError(f"--to pipelines: {view.caveat}")
        return PipelinesSink(view.crawler, view.spider), "pipelines", default_consumer()
    if "://" in to:
        sql = SqlSink(to, spider, args.table)
        return sql, f"sql:{sql.display_url}#{args.table}", default_consumer()
    raise ConfigError(f"--to {to!r}: give {ITEM_SINKS}")


async def _earlier_group(queue: RedisQueue, group: str, args: argparse.Namespace) -> str:
    """*group*, or the group a relative SQLite path was named by before it was made
    absolute (``sql:sqlite:///items.db#...``), where that group is in Redis and *group*
    is not: left behind, it would keep every later item in the stream."""
    earlier = f"sql:{mask_url(args.to)}#{args.table}"
    if earlier == group or not group.startswith("sql:sqlite"):  # sqlite+pysqlite: too
        return group
    names: set[str] = set()
    for shard in shards_of(queue):
        try:
            found = await shard.client.xinfo_groups(shard.keys.items)
        except redis.ResponseError as exc:
            if "no such key" not in str(exc).lower():  # a cluster's blip: no guess made
                raise
            continue  # no stream yet
        names |= {text(g["name"]) for g in found}
    if earlier in names and group not in names:
        print(
            f"consuming into group {earlier}, named by the relative path before this version "
            f"(the default is now {group}): pass --group to choose",
            file=sys.stderr,
        )
        return earlier
    return group


def _check_usage(args: argparse.Namespace) -> None:
    """Options given with an action they do not go with: a usage error (exit 2)."""
    if getattr(args, "ids", None) and not args.retry_aside:
        raise ConfigError("--id goes with --retry-aside")
    if args.create and (args.aside or args.retry_aside or args.undeclare):
        raise ConfigError("--create goes with consuming or --declare")
    if (args.yes or args.dry_run) and not args.undeclare:
        raise ConfigError("--yes and --dry-run go with --undeclare")


async def items(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Store the crawl's items (HA_ITEMS = "outbox") exactly once in a sink."""
    sink, group, consumer = _sink(args, queue.keys.spider)
    if args.group is None:
        group = await _earlier_group(queue, group, args)
    group, consumer = args.group or group, args.consumer or consumer
    runner = ItemConsumer(
        queue,
        sink,
        group=group,
        consumer=consumer,
        batch=args.batch,
        claim_idle=args.claim_idle,
        deaths=args.deaths,
    )
    _check_usage(args)
    if args.undeclare:
        from scrapy_ha.cli.undeclare import undeclare

        return await undeclare(queue, group, args)
    if args.aside or args.retry_aside:
        from scrapy_ha.cli.aside import list_aside, retry_aside

        if args.retry_aside:
            return await retry_aside(queue, runner, args.ids)
        return await list_aside(queue, group)
    _note_no_outbox(args, queue.keys.spider)
    if args.declare:
        missed = await runner.join()
        print(f"group {group} of {queue.keys.spider} is ready (items it misses: {missed})")
        return 0
    stop, task = asyncio.Event(), asyncio.current_task()
    loop = asyncio.get_running_loop()
    if CTRL_C.is_set():  # pressed while the command started, its KeyboardInterrupt swallowed
        raise KeyboardInterrupt
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, _stopping, stop, task)
    print(
        f"consuming the items of {queue.keys.spider} into {mask_url(args.to)} (group {group}, "
        f"consumer {consumer})",
        file=sys.stderr,
        flush=True,
    )
    try:
        report = await runner.run(stop=stop, exit_idle=args.exit_idle)
    except asyncio.CancelledError:  # a second signal (see _stopping)
        print("interrupted: the batch under way is delivered again", file=sys.stderr)
        return INTERRUPTED
    except SinkDidNotOpen as exc:
        raise ConfigError(f"--to {mask_url(args.to)}: {exc}") from None
    except GroupGone as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    print(
        f"consumed {report.consumed} item(s) in {report.batches} batch(es): "
        f"{report.recovered} committed before a restart, {report.claimed} taken over from "
        f"other consumers, {report.errors} write(s) failed and delivered again "
        f"({report.lone_failures} of an entry alone), {report.set_aside} set aside",
        flush=True,
    )
    return 1 if report.stuck else 0  # --exit-idle left entries pending (its WARNING)


def _note_no_outbox(args: argparse.Namespace, spider: str) -> None:
    """Say so when the spider's workers commit no items (``HA_ITEMS`` is not ``"outbox"``
    in the project): the consumer would wait for ever, consuming nothing."""
    view = args.worker_view
    if view.caveat or items_mode(view.crawler.settings) == "outbox":
        return  # (outside the project: its workers' settings are not known here)
    print(
        f"note: HA_ITEMS of spider {spider} is 'off' in this project: workers started with its "
        f"settings commit no items to the stream, so this sink gets none of theirs (set "
        f'HA_ITEMS = "outbox")',
        file=sys.stderr,
    )


def _stopping(stop: asyncio.Event, task: asyncio.Task[Any] | None) -> None:
    """Ctrl-C or SIGTERM: the first finishes the batch under way, a second gives it up (a
    sink whose database froze never finishes it; what it did not acknowledge is delivered
    again)."""
    if stop.is_set() and task is not None:
        task.cancel()
    stop.set()


def in_loop(args: argparse.Namespace, main: Coroutine[Any, Any, int]) -> int:
    """Run *main*: on the asyncio loop of Twisted's asyncio reactor for ``--to pipelines``
    (a pipeline may return Deferreds or use the reactor), else on a loop of its own."""
    if getattr(args, "to", None) != "pipelines":
        return asyncio.run(main)
    from scrapy.utils.reactor import install_reactor

    with contextlib.suppress(Exception):  # a reactor installed already (tests): use its loop
        install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")
    return asyncio.get_event_loop().run_until_complete(main)
