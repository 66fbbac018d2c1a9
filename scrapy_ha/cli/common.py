"""What every ``scrapy-ha`` subcommand shares: registration, time formats, confirmation.

A bulk action (requeue, purge, retry-now, flush, reset) goes through :func:`approve`: with
``--dry-run`` it only says what it would touch; on a terminal it asks first unless
``--yes``; without a terminal it needs ``--yes`` (a script must say it means it).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from scrapy_ha.ops.display import TIME_FORMAT

if TYPE_CHECKING:
    from scrapy_ha.store.queue import RedisQueue

#: A subcommand: what it prints goes to stdout/stderr, what it returns is the exit code.
Command = Callable[["RedisQueue", argparse.Namespace], Awaitable[int]]

#: Items a dry run names one by one before it only counts the rest (a screenful).
DRY_RUN_SHOWN = 20
#: Duration units accepted by ``--since 24h`` and friends, in seconds.
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: Local date-time formats accepted by ``--since`` / ``--until`` (the first is what we print).
TIME_FORMATS = (TIME_FORMAT, "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")


def global_options() -> argparse.ArgumentParser:
    """``--redis-url`` and ``--prefix`` for every subcommand's parser, so that they are
    accepted after the subcommand too (``SUPPRESS``: a subparser never overwrites what
    was given before the subcommand)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--redis-url",
        default=argparse.SUPPRESS,
        help="Redis URL (default: $REDIS_URL, else the project's REDIS_URL, else "
        "redis://localhost:6379/0)",
    )
    common.add_argument(
        "--prefix", default=argparse.SUPPRESS, help="key prefix (default: HA_KEY_PREFIX or ha)"
    )
    common.add_argument(
        "--shards",
        type=int,
        default=argparse.SUPPRESS,
        help="the crawl's HA_SHARDS (default: the count the crawl stored in Redis)",
    )
    return common


#: Built once: every subcommand's parser has it as a parent.
GLOBAL_OPTIONS = global_options()


def command(sub: Any, name: str, func: Command, *, spider: bool = True) -> argparse.ArgumentParser:
    """The subcommand *name*, which runs *func* (argparse dispatches: ``args.func``); its
    help is *func*'s docstring, its first argument the spider."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=func.__doc__, description=func.__doc__, parents=[GLOBAL_OPTIONS]
    )
    parser.set_defaults(func=func)
    if spider:
        parser.add_argument("spider")
    return parser


def group(sub: Any, name: str, help_: str) -> Any:
    """A group of subcommands (``dlq``, ``delayed``, ...)."""
    parser = sub.add_parser(name, help=help_, parents=[GLOBAL_OPTIONS])
    return parser.add_subparsers(dest=name, required=True)


def add_bulk_options(parser: argparse.ArgumentParser) -> None:
    """``--dry-run`` and ``--yes`` of a bulk action."""
    parser.add_argument(
        "--dry-run", action="store_true", help="say what would be touched; touch nothing"
    )
    parser.add_argument(
        "-y", "--yes", action="store_true", help="do not ask (needed when stdin is not a terminal)"
    )


def approve(args: argparse.Namespace, verb: str, what: str, items: list[str]) -> bool | None:
    """May the bulk action go on? True: go; False: refused (said why, exit code 1); None:
    a dry run (said what it would do, exit code 0). *what* counts the items (``"3 entries
    of books"``), *items* name them."""
    if args.dry_run:
        print(f"would {verb} {what} (dry run: nothing changed)")
        for item in items[:DRY_RUN_SHOWN]:
            print(f"  {item}")
        if len(items) > DRY_RUN_SHOWN:
            print(f"  ... and {len(items) - DRY_RUN_SHOWN} more")
        return None
    if args.yes or not items:
        return True
    if not sys.stdin.isatty():
        print(
            f"refusing to {verb} {what} without --yes: stdin is not a terminal, so nobody "
            f"can confirm (pass --yes, or --dry-run to see what it would touch)",
            file=sys.stderr,
        )
        return False
    try:
        answer = input(f"{verb} {what}? [y/N] ").strip().lower()
    except EOFError:  # the terminal closed: no answer is no
        answer = ""
    if answer in ("y", "yes"):
        return True
    print("cancelled: nothing changed", file=sys.stderr)
    return False


def parse_when(text: str, now_ms: int, *, option: str) -> int:
    """``--since``/``--until``: a duration back from now (``24h``, ``30m``, ``7d``) or a
    local date-time (``2026-11-30 17:05``); returns ms since the epoch."""
    match = _DURATION.match(text.strip())
    if match:
        return now_ms - int(float(match[1]) * DURATION_UNITS[match[2]] * 1000)
    for fmt in TIME_FORMATS:
        try:
            return int(time.mktime(time.strptime(text.strip(), fmt)) * 1000)
        except ValueError:
            continue
    raise argparse.ArgumentTypeError(
        f"{option} {text!r}: give a duration back from now (90s, 30m, 24h, 7d, 2w) or a local "
        f"date-time (2026-11-30 17:05:12, 2026-11-30)"
    )


def plural(n: int, one: str, many: str | None = None) -> str:
    """``1 entry``, ``3 entries``."""
    return f"{n} {one if n == 1 else (many or one + 's')}"
