"""``scrapy-ha``: look at and operate a crawl's queue from the shell.

Redis is found from ``--redis-url``, else the Scrapy project's settings
(``REDIS_URL``, ``REDIS_PARAMS``... when run inside a project), else
``redis://localhost:6379/0``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable

from scrapy.settings import Settings

from scrapy_ha.config import ConfigError
from scrapy_ha.connection import RedisUnavailable, check_reachable, display_url, redis_from_settings
from scrapy_ha.keys import DEFAULT_PREFIX, Keys
from scrapy_ha.queue import RedisQueue

Command = Callable[[RedisQueue, argparse.Namespace], Awaitable[int]]
_COMMANDS: dict[str, Command] = {}


def command(name: str) -> Callable[[Command], Command]:
    def register(func: Command) -> Command:
        _COMMANDS[name] = func
        return func

    return register


def _settings(args: argparse.Namespace) -> Settings:
    try:
        from scrapy.utils.project import get_project_settings

        settings = get_project_settings()
    except Exception:  # not in a project: plain defaults
        settings = Settings()
    if args.redis_url:
        settings.set("REDIS_URL", args.redis_url, priority="cmdline")
    return settings


async def _run(args: argparse.Namespace) -> int:
    settings = _settings(args)
    prefix = args.prefix or settings.get("HA_KEY_PREFIX") or DEFAULT_PREFIX
    client = redis_from_settings(settings, connect_timeout=5.0)
    try:
        await check_reachable(client, display_url(settings), 5.0)
        queue = RedisQueue(client, Keys(prefix, args.spider))
        return await _COMMANDS[args.command](queue, args)
    finally:
        await client.aclose()


@command("status")
async def status(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Counts per state (pending, leased, delayed, dead), live workers, fingerprints."""
    counts = (await queue.counts()).as_dict()
    if args.json:
        print(json.dumps({"spider": queue.keys.spider, **counts}))
    else:
        for name, value in counts.items():
            print(f"{name:>13}  {value}")
    return 0


@command("flush")
async def flush(queue: RedisQueue, args: argparse.Namespace) -> int:
    """Delete every key of the crawl (dead-letter queue included); refuses while workers live."""
    counts = await queue.counts()
    if counts.workers and not args.force:
        print(f"{counts.workers} worker(s) of {queue.keys.spider} are alive: stop them first, "
              f"or pass --force", file=sys.stderr)  # fmt: skip
        return 1
    await queue.flush()
    print(f"flushed {queue.keys.spider}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scrapy-ha", description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", help="Redis URL (default: the project's REDIS_URL)")
    parser.add_argument("--prefix", help=f"key prefix (default: HA_KEY_PREFIX or {DEFAULT_PREFIX})")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("status", help=status.__doc__)
    p.add_argument("spider")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p = sub.add_parser("flush", help=flush.__doc__)
    p.add_argument("spider")
    p.add_argument("--force", action="store_true", help="even while workers are alive")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(_run(args))
    except (RedisUnavailable, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
