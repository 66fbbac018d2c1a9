"""What every ``scrapy-ha`` subcommand shares: time formats, confirmation, plurals (the
command line itself is :mod:`.grammar`).

A bulk action (requeue, purge, retry-now, flush, reset) goes through :func:`approve`: with
``--dry-run`` it only says what it would touch; on a terminal it asks first unless
``--yes``; without a terminal it needs ``--yes`` (a script must say it means it).
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from scrapy_ha.ops.display import TIME_FORMAT

if TYPE_CHECKING:
    from scrapy_ha.store.queue import RedisQueue

#: The exit code of a command Ctrl-C stopped (128 + SIGINT, as a shell reports it).
INTERRUPTED = 130
#: Set by the command line's SIGINT handler (cli/cmdline.py): a Ctrl-C whose
#: KeyboardInterrupt a library caught (lxml's initialisation does, when the signal lands in
#: it while Scrapy is imported) still stops a command that runs on (``items`` checks it
#: before it settles in)
CTRL_C = threading.Event()
#: A subcommand: what it prints goes to stdout/stderr, what it returns is the exit code.
Command = Callable[["RedisQueue", argparse.Namespace], Awaitable[int]]

#: Items a dry run names one by one before it only counts the rest (a screenful).
DRY_RUN_SHOWN = 20
#: Duration units accepted by ``--since 24h`` and friends, in seconds.
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: Local date-time formats accepted by ``--since`` / ``--until`` (the first is what we print).
TIME_FORMATS = (TIME_FORMAT, "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")


def approve(
    args: argparse.Namespace, verb: str, what: str, items: list[str], count: int | None = None
) -> bool | None:
    """May the bulk action go on? True: go; False: refused (said why, exit code 1); None:
    a dry run (said what it would do, exit code 0). *what* counts the items (``"3 entries
    of books"``), *items* name them, or the first of them when *count* says how many
    (a large selection is not held whole: see :mod:`.bulk`)."""
    count = len(items) if count is None else count
    if args.dry_run:
        print(f"would {verb} {what} (dry run: nothing changed)")
        for item in items[:DRY_RUN_SHOWN]:
            print(f"  {item}")
        if count > DRY_RUN_SHOWN:
            print(f"  ... and {count - DRY_RUN_SHOWN} more")
        return None
    if args.yes or not count:
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


def parse_when(text: str, now_ms: int, *, option: str, end: bool = False) -> int:
    """``--since``/``--until``: a duration back from now (``24h``, ``30m``, ``7d``) or a
    local date-time (``2026-11-30 17:05``); returns ms since the epoch. With *end* (for
    ``--until``, which includes what it names) a date-time is the last millisecond of the
    second, minute or day it names (a QA run: ``--until 2026-12-06`` left that day out)."""
    match = _DURATION.match(text.strip())
    if match and (back := float(match[1]) * DURATION_UNITS[match[2]] * 1000) < 2**62:
        return now_ms - int(back)
    for fmt in TIME_FORMATS:
        try:
            named = time.strptime(text.strip(), fmt)
        except ValueError:
            continue
        start = int(time.mktime(named) * 1000)
        if not end:
            return start
        if "%S" in fmt:
            return start + 999
        if "%M" in fmt:
            return start + 59_999
        after = (*named[:2], named[2] + 1, 0, 0, 0, 0, 0, -1)  # the next day's midnight
        return int(time.mktime(after) * 1000) - 1  # (mktime normalises the day; DST too)
    raise argparse.ArgumentTypeError(
        f"{option} {text!r}: give a duration back from now (90s, 30m, 24h, 7d, 2w) or a local "
        f"date-time (2026-11-30 17:05:12, 2026-11-30)"
    )


def say_missing(what: str, missing: list[str], spider: str) -> None:
    """Name on stderr the IDs a bulk action did not find (``no dead letter 7, 9 in books``):
    a typo, or gone meanwhile; the others are done, and the exit code is 1."""
    if missing:
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        print(f"no {what} {', '.join(missing[:10])}{more} in {spider}", file=sys.stderr)


def say_unknown_class(name: str | None) -> None:
    """Say on stderr that ``--class`` *name*, which matched nothing, is no class scrapy-ha
    sets, and the nearest that is: a typo lists nothing, silently, otherwise. A project's
    own class (its spider's ban check) is one scrapy-ha does not know; it is filtered all
    the same."""
    from scrapy_ha.ops.labels import CLASSES
    from scrapy_ha.verdict import WAIT_CLASSES

    if name in WAIT_CLASSES:  # (a script written before the waits were class proxy)
        print(
            f"note: --class {name} matched nothing; a request waiting for a proxy is of "
            "class proxy",
            file=sys.stderr,
        )
        return
    if name is None or name in CLASSES:
        return
    near = difflib.get_close_matches(name.lower(), list(CLASSES), n=1)
    hint = f"did you mean {near[0]}? " if near else ""
    print(
        f"note: --class {name} matched nothing; it is not a class scrapy-ha sets ({hint}"
        f"its classes: {', '.join(CLASSES)})",
        file=sys.stderr,
    )


def plural(n: int, one: str, many: str | None = None) -> str:
    """``1 entry``, ``3 entries``, ``3,000 entries`` (as ``status`` writes its figures)."""
    return f"{n:,} {one if n == 1 else (many or one + 's')}"
