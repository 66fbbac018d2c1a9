"""Runs ``scrapy-ha status SPIDER --watch`` (``cli.main``) N times in this process, each
stopped by a Ctrl-C (SIGINT to itself) at a random moment after its second refresh, and
prints ``ended N``. A run that ignores its Ctrl-C refreshes on: faulthandler then prints
the stacks and exits with status 1 after DEADLINE seconds.

Usage: python -m tests.watch_ctrl_c REDIS_URL SPIDER N
"""

from __future__ import annotations

import faulthandler
import io
import os
import random
import signal
import sys
import threading

from scrapy_ha.cli import cmdline as cli

#: Seconds one run may take once its Ctrl-C is sent (a refresh is a few milliseconds).
DEADLINE = 10.0


class Screen(io.StringIO):
    """Stands for stdout: sends the Ctrl-C once two refreshes were drawn."""

    def __init__(self) -> None:
        super().__init__()
        self.refreshes = 0
        self.sent = threading.Event()

    def write(self, text: str) -> int:
        self.refreshes += text.count("totals")
        if self.refreshes >= 2 and not self.sent.is_set():
            self.sent.set()
            delay = random.uniform(0, 0.11)  # anywhere in a refresh (0.1 s, the least), or between
            threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT)).start()
        return super().write(text)


def main(redis_url: str, spider: str, runs: int) -> None:
    ended = 0
    for _ in range(runs):
        screen = Screen()
        sys.stdout = screen
        faulthandler.dump_traceback_later(DEADLINE, exit=True, file=sys.__stderr__)
        try:
            code = cli.main(["--redis-url", redis_url, "status", spider, "--watch", "0.1"])
        except KeyboardInterrupt:
            code = 0  # the Ctrl-C landed outside the command's loop: it ended too
        finally:
            faulthandler.cancel_dump_traceback_later()
            sys.stdout = sys.__stdout__
        assert code == 0, code
        assert screen.sent.is_set(), "no second refresh"
        ended += 1
    print(f"ended {ended}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
