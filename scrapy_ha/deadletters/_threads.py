"""Blocking database calls awaited from asyncio without holding up the process's exit.

An executor's threads (``asyncio.to_thread``'s too) are joined when the interpreter exits
and when ``asyncio.run`` ends: a call that waits for a database that never answers (a
server frozen mid-query, which a connection timeout does not bound) would then hold a
closing worker, or a command stopped with Ctrl-C, for ever. A daemon thread is left behind.
"""

from __future__ import annotations

__all__ = ["in_daemon_thread"]

import asyncio
import threading
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable

_T = TypeVar("_T")


def in_daemon_thread(call: Callable[..., _T], *args: Any) -> asyncio.Future[_T]:
    """The result of ``call(*args)``, run in a daemon thread of its own: a database that
    never answers (frozen) holds that thread, never the process's exit. Cancelling the
    future gives the call up (its result, when it comes, is dropped)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[_T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # given up (the close's wait ran out)
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    def run() -> None:
        try:
            done: tuple[Any, BaseException | None] = (call(*args), None)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            done = (None, exc)
        try:
            loop.call_soon_threadsafe(settle, *done)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    threading.Thread(target=run, name="scrapy-ha-archive", daemon=True).start()
    return future
