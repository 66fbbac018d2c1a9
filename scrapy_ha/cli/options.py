"""The pieces the ``scrapy-ha`` command line is built of (:mod:`.grammar`): the function a
subcommand runs, the options every command takes, and the types of options checked at
parse time. Like the grammar, it imports neither Scrapy nor redis."""

from __future__ import annotations

__all__ = [
    "CRAWL_OPTIONS",
    "PORT",
    "REDIS_URL_ENV",
    "SERVER_OPTIONS",
    "Target",
    "at",
    "bulk_options",
    "command",
    "create_option",
    "group",
    "parse_window",
    "positive",
    "whole",
    "when",
]

import argparse
import importlib
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_ha.cli.common import parse_when
from scrapy_ha.keys import DEFAULT_PREFIX

if TYPE_CHECKING:
    from collections.abc import Callable

#: The environment variable that gives the Redis URL when ``--redis-url`` is not given
#: (the name scrapy-redis's own setting has, so one export serves both).
REDIS_URL_ENV = "REDIS_URL"
#: Units of ``report --since``, in seconds.
WINDOW_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Target:
    """The function a subcommand runs, by module and name, imported when it runs."""

    module: str
    name: str

    @property
    def __name__(self) -> str:  # what ``args.func.__name__`` says of a plain function
        return self.name

    def load(self) -> Callable[..., Any]:
        func: Callable[..., Any] = getattr(importlib.import_module(self.module), self.name)
        return func


def at(module: str, name: str) -> Target:
    """The function *name* of ``scrapy_ha.cli.<module>``."""
    return Target(f"scrapy_ha.cli.{module}", name)


# -- option types, checked at parse time --------------------------------------------------


def parse_window(text: str) -> int:
    """Seconds of a window written ``24h``, ``90m``, ``7d``, ``30s`` or ``3600``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    # (a window of less than a second was taken as 0 s: `--since 0.1` reported the
    # current minute's acks for a window "21:22:56 .. 21:22:56")
    seconds = int(float(match.group(1)) * WINDOW_UNITS[match.group(2) or "s"]) if match else 0
    if seconds < 1:
        raise argparse.ArgumentTypeError(
            f"--since {text!r}: write a duration of a second or more, such as 24h, 90m, 7d "
            "or 3600 (seconds)"
        )
    return seconds


def when(option: str) -> Callable[[str], Callable[[int], int]]:
    """An argparse type: checks a time at parse time, resolves it against Redis's clock."""

    end = option == "--until"  # (includes the second, minute or day it names)

    def parse(text: str) -> Callable[[int], int]:
        parse_when(text, 0, option=option)  # a bad value is a usage error, before connecting
        return lambda now_ms: parse_when(text, now_ms, option=option, end=end)

    return parse


#: The most seconds an option takes (about 11 days): a QA run's ``metrics --timeout 1e10``
#: was taken, and every scrape then failed (a socket timeout past what the OS's clock holds).
MAX_SECONDS = 1_000_000


def positive(text: str) -> float:
    """A number of seconds above 0 and at most :data:`MAX_SECONDS` (argparse names the
    option when this fails)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds above 0 and at most {MAX_SECONDS:,}"
        )
    return seconds


def setting_pair(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` of ``-s``, as ``scrapy crawl -s`` takes it (argparse names the option
    when this fails)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name.strip(), value


def redis_url_option(text: str) -> str:
    """``--redis-url``, not blank (a QA run: ``--redis-url ''`` went to the default Redis
    in silence, the one a script with an unset variable did not mean)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r} is no URL: give one (redis://host:port/db), or leave the option out "
            f"for ${REDIS_URL_ENV}, the project's settings, or redis://localhost:6379/0"
        )
    return text


def prefix_option(text: str) -> str:
    """``--prefix``, checked as ``HA_KEY_PREFIX`` is (imported here: ``--help`` and
    ``--version`` import neither Scrapy nor redis-py)."""
    from scrapy_ha.config.scheduler import check_key_prefix  # noqa: PLC0415
    from scrapy_ha.config.validate import ConfigError  # noqa: PLC0415

    try:
        check_key_prefix(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("HA_KEY_PREFIX=", "")) from None
    return text


def spider_name(text: str) -> str:
    """A crawl's name: not empty (``pause ''`` wrote ``ha:{}:paused``, a crawl of no name)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is no spider name")
    return text


def seconds_from(low: float) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds of *low* or more; argparse names the
    option when it fails (``argument --watch: '1e-300' is not a finite number of seconds
    of 0.1 or more``), before the command reaches Redis."""

    def parse(text: str) -> float:
        try:
            seconds = float(text)
        except ValueError:
            seconds = math.nan
        if not low <= seconds < math.inf:  # nan compares false
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a finite number of seconds of {low:g} or more"
            )
        return seconds

    return parse


def whole(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from *low* (up to *high*); argparse names the
    option when it fails (``argument --limit: '-1' is not a whole number of 0 or more``)."""

    def parse(text: str) -> int:
        try:
            n: int | None = int(text)
        except ValueError:
            n = None
        if n is None or n < low or (high is not None and n > high):
            span = f"from {low} to {high}" if high is not None else f"of {low} or more"
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number {span}")
        return n

    return parse


#: A TCP port to listen on (0: any free one, the system's choice).
PORT = whole(0, 65535)


# -- the options every command takes -------------------------------------------------------


def _connection_options(*, shards: bool) -> argparse.ArgumentParser:
    """``--redis-url`` and ``--prefix`` (and ``--shards`` for a command on one crawl), for
    every subcommand's parser, so that they are accepted and listed after the subcommand
    too (``SUPPRESS``: a subparser never overwrites what was given before it)."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("options of every command")
    group.add_argument(
        "--redis-url",
        type=redis_url_option,
        default=argparse.SUPPRESS,
        help="redis://, rediss://, unix://, redis+sentinel:// or redis+cluster:// URL "
        f"(default: ${REDIS_URL_ENV}, else the project's REDIS_URL, REDIS_SENTINELS or "
        "REDIS_CLUSTER_NODES, else redis://localhost:6379/0)",
    )
    group.add_argument(
        "--prefix",
        type=prefix_option,
        default=argparse.SUPPRESS,
        help=f"key prefix (default: the project's HA_KEY_PREFIX, else {DEFAULT_PREFIX})",
    )
    if shards:
        group.add_argument(
            "--shards",
            type=int,
            default=argparse.SUPPRESS,
            help="the crawl's HA_SHARDS (default: the count the crawl stored in Redis)",
        )
    return common


#: Built once: the parents of every subcommand's parser (on one crawl, or on all of them).
CRAWL_OPTIONS = _connection_options(shards=True)
SERVER_OPTIONS = _connection_options(shards=False)


def command(
    sub: Any, name: str, target: Target, help_: str, *, spider: bool = True
) -> argparse.ArgumentParser:
    """The subcommand *name*, which runs *target*; *help_* is its help, its first argument
    the spider (for a command on one crawl)."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help_,
        description=help_,
        parents=[CRAWL_OPTIONS if spider else SERVER_OPTIONS],
    )
    parser.set_defaults(func=target, create_allowed=False)
    if spider:
        parser.add_argument("spider", type=spider_name)
    return parser


def group(sub: Any, name: str, help_: str) -> Any:
    """A group of subcommands (``dlq``, ``delayed``, ...)."""
    parser = sub.add_parser(name, help=help_, description=help_, parents=[CRAWL_OPTIONS])
    return parser.add_subparsers(dest=name, required=True, metavar="COMMAND")


def bulk_options(parser: argparse.ArgumentParser) -> None:
    """``--dry-run`` and ``--yes`` of a bulk action (see :func:`~.common.approve`)."""
    parser.add_argument(
        "--dry-run", action="store_true", help="say what would be touched; touch nothing"
    )
    parser.add_argument(
        "-y", "--yes", action="store_true", help="do not ask (needed when stdin is not a terminal)"
    )


def create_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--create``: the command may make a crawl that is not in Redis yet (without it, a
    spider name with a typo is "no such crawl", not a new crawl nobody runs)."""
    parser.set_defaults(create_allowed=True)
    parser.add_argument(
        "--create",
        action="store_true",
        help=f"{what} even if the crawl is not in Redis yet (else: no such crawl)",
    )


def item_actions(parser: argparse.ArgumentParser) -> None:
    """``scrapy-ha items``' options that do something else than consume, one at a time."""
    actions = parser.add_mutually_exclusive_group()
    actions.add_argument(
        "--declare",
        action="store_true",
        help="only create the sink's consumer group and exit: a sink declared before the "
        "crawl gets every item (entries leave the stream once every group has them)",
    )
    actions.add_argument(
        "--undeclare",
        action="store_true",
        help="take the sink's consumer group away and exit (a group declared by mistake keeps "
        "every later item in Redis): what it has not consumed is lost to that sink; asks "
        "first (--yes, --dry-run); stop its consumers first",
    )
    actions.add_argument(
        "--aside",
        action="store_true",
        help="list the entries the group set aside (id, when, reason) and exit",
    )
    actions.add_argument(
        "--retry-aside",
        action="store_true",
        help="write the group's set-aside entries to the sink (keyed by their entry id), "
        "each removed from aside once committed, and exit",
    )
    parser.add_argument(
        "--id",
        action="append",
        dest="ids",
        metavar="ID",
        help="with --retry-aside: only this entry (as --aside lists it; repeat for several)",
    )
    bulk_options(parser)  # --undeclare's
