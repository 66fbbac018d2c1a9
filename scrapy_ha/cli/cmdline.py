"""``scrapy-ha``: look at and operate a crawl's queue from the shell.

The command line is parsed first (:mod:`.grammar`, which imports neither Scrapy nor
redis: ``--help``, ``--version`` and usage errors answer at once), then the command runs
(:mod:`.runner`: the connection, the crawl, and the function the subcommand names).
Everything a command prints or logs is masked (:mod:`scrapy_ha.codec.masking`).
"""

from __future__ import annotations

__all__ = ["main"]

import os
import sys

from scrapy_ha.cli.grammar import parse

#: The exit code of a command Ctrl-C stopped (128 + SIGINT, as a shell reports it).
INTERRUPTED = 130


def main(argv: list[str] | None = None) -> int:
    """Run a command; its exit code (0 done, 1 refused or nothing to do, or its output's
    reader went away, 2 an error, 130 stopped by Ctrl-C)."""
    args = parse(argv)
    try:
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


if __name__ == "__main__":
    sys.exit(main())
