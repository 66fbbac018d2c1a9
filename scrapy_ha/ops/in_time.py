"""A call given a number of seconds in all: what bounds a scrape of ``scrapy-ha metrics``
as a whole, where each Redis call is bounded alone (a Redis that answers every call a
little under ``--timeout`` made a scrape of several calls outlast Prometheus's)."""

from __future__ import annotations

__all__ = ["within"]

import threading
from typing import TYPE_CHECKING, Any, TypeVar

import redis

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")


def within(seconds: float | None, call: Callable[[], T]) -> T:
    """*call*'s result, or its exception; a ``redis`` TimeoutError if it has not returned
    after *seconds* (None: no bound). It then goes on in its thread, which ends with its own
    calls' timeouts: what it finds (the crawls a SCAN found) serves the next scrape."""
    if seconds is None:
        return call()
    ended: dict[str, Any] = {}

    def run() -> None:
        try:
            ended["result"] = call()
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
            ended["error"] = exc

    thread = threading.Thread(target=run, name="scrapy-ha-scrape", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise redis.exceptions.TimeoutError(f"Redis did not answer the scrape within {seconds} s")
    if "error" in ended:
        raise ended["error"]
    return ended["result"]  # type: ignore[no-any-return]
