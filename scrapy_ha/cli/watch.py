"""``--watch``: a view drawn again in place until Ctrl-C (``scrapy-ha status``)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import TYPE_CHECKING, Any, TextIO

from scrapy_ha.codec.log_masking import visible
from scrapy_ha.codec.masking import mask_text

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["CLEAR_SCREEN", "controls", "draw", "restore_ctrl_c", "stop_on_ctrl_c"]

#: Terminal controls: cursor home, clear to the end of the line, clear the rest of the screen,
#: clear the whole screen. Drawing over the last frame line by line (instead of clearing first)
#: keeps the screen from flickering.
HOME, CLEAR_LINE, CLEAR_BELOW, CLEAR_SCREEN = "\x1b[H", "\x1b[K", "\x1b[J", "\x1b[2J"


def stop_on_ctrl_c() -> asyncio.Event:
    """An event Ctrl-C sets, for ``--watch``: it stops at the next refresh, and at once
    while it waits between two (the command's task is cancelled too, as asyncio.run does).

    Not the task's cancellation alone: on Python 3.11, a cancellation that lands as a
    Redis command's write completes is lost inside ``asyncio.wait_for`` (which redis-py
    uses to time writes; CPython issue gh-86296), and the watch would refresh on. A second
    Ctrl-C raises KeyboardInterrupt, as Python's own handler does."""
    stop = asyncio.Event()
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()

    def first_ctrl_c() -> None:
        stop.set()
        restore_ctrl_c()
        if task is not None:
            task.cancel()

    with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
        loop.add_signal_handler(signal.SIGINT, first_ctrl_c)  # main thread, POSIX only
    return stop


def restore_ctrl_c() -> None:
    with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
        asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)


def draw(out: TextIO, lines: list[str], *, in_place: bool, last: bool) -> None:
    """*lines*, over the last frame (*in_place*, in one write: a frame drawn line by line
    reaches a terminal in pieces) or after it; the lines' text made visible as the CLI's
    stdout makes it (``codec/log_masking.py``), the cursor moves written raw."""
    if in_place:
        frame = "".join(f"{visible(mask_text(line))}{CLEAR_LINE}\n" for line in lines)
        controls(out)(HOME + frame + CLEAR_BELOW)
        return
    out.write("\n".join(lines) + "\n" + ("" if last else "\n"))


def controls(out: TextIO) -> Callable[[str], Any]:
    """How *out* takes a terminal control of the CLI's own, as it is."""
    write: Callable[[str], Any] = getattr(out, "write_raw", out.write)
    return write
