"""``scrapy-ha``: look at and operate a crawl's queue from the shell.

The command line is parsed first (:mod:`.grammar`, which imports neither Scrapy nor
redis: ``--help``, ``--version`` and usage errors answer at once), then the command runs
(:mod:`.runner`: the connection, the crawl, and the function the subcommand names).
Everything a command prints or logs is masked (:mod:`scrapy_ha.codec.masking`).
"""

from __future__ import annotations

__all__ = ["main"]

import os
import signal
import sys
from typing import Any

from scrapy_ha.cli.common import CTRL_C, INTERRUPTED
from scrapy_ha.cli.grammar import parse


def main(argv: list[str] | None = None) -> int:
    """Run a command; its exit code (0 done, 1 refused or nothing to do, or its output's
    reader went away, 2 an error, 130 stopped by Ctrl-C)."""
    before = _interrupt_where_it_runs()  # first: reading a long line takes a while too
    try:
        args = parse(argv)
        if not _cwd_exists():
            return 2
        from scrapy_ha.cli import runner  # Scrapy and redis: only once a command runs

        return runner.run(args)
    except KeyboardInterrupt:  # Ctrl-C: a line, not Python's traceback
        print("interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        # the reader of its output went away (``| head``): the rest is not wanted, and the
        # interpreter's own flush at exit must not fail again (Python's recipe, signal docs)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    finally:
        if before is not None:
            signal.signal(signal.SIGINT, before)


def _cwd_exists() -> bool:
    """Whether the working directory, where a project is looked for, still exists (a shell
    left in a directory removed since: every command ended in a traceback); an error line
    if not."""
    try:
        os.getcwd()
    except FileNotFoundError:
        print(
            "error: the working directory no longer exists (removed since the shell entered "
            "it): cd to a directory that exists, then run the command again",
            file=sys.stderr,
        )
        return False
    return True


def _interrupt_where_it_runs() -> Any:
    """Have Ctrl-C raise KeyboardInterrupt where the main thread is, as Python's own
    handler does, and return the handler it replaced (None: not the main thread). Not
    ``asyncio.run``'s handler, which cancels the command's task instead: on Python 3.11 a
    cancellation that lands as a Redis command's write completes is lost (CPython issue
    gh-86296), and the command ran on, to its 5 s timeout or, on a frozen database, for
    ever. The commands that stop cleanly on Ctrl-C (``watch``, ``items``, ``metrics``)
    put their own handlers in place meanwhile. A SIGINT ignored (a shell's background job)
    or handled otherwise than Python's default stays so, as asyncio.run leaves it."""

    def interrupt(signum: int, frame: Any) -> None:
        CTRL_C.set()
        raise KeyboardInterrupt

    CTRL_C.clear()
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return None
    try:
        return signal.signal(signal.SIGINT, interrupt)
    except ValueError:  # not the main thread (a caller's own): its handling stays
        return None


if __name__ == "__main__":
    sys.exit(main())
