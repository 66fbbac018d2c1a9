"""The item consumer's start: a consumer is a long-running service (as a Sidekiq or Celery
worker is), so started while its Redis is not reachable (a container up before Redis, a
Redis restarting or failing over) it waits for it as a Scrapy worker does: the same
settings (``HA_START_TIMEOUT``, ``HA_CONNECT_TIMEOUT``, ``HA_RECONNECT_MAX_DELAY``, from
the project or ``-s``), a WARNING line per attempt naming the URL (password masked), then
the error (exit code 2) once ``HA_START_TIMEOUT`` has passed. Ctrl-C or SIGTERM during the
wait stops it at once: one line, and exit code 130 or 143 (128 + the signal, as a shell
reports a process the signal ended). The other actions of ``items`` (``--declare``,
``--undeclare``, ``--aside``, ``--retry-aside``) and every other command run once: they
fail at once with the error."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import TYPE_CHECKING, Any

from scrapy_ha.cli.options import REDIS_URL_ENV
from scrapy_ha.config.start_wait import StartWaitConfig
from scrapy_ha.store.connection import REDIS_DOWN_ERRORS
from scrapy_ha.store.start_wait import Halt, StartWait, StoppedAtStart

if TYPE_CHECKING:
    import argparse
    from collections.abc import Awaitable, Callable

    from scrapy.settings import BaseSettings

__all__ = ["StoppedWaiting", "consumes", "wait_for_redis"]

#: The signals that stop the wait (and, once it runs, the consumer: :mod:`.items`).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: The actions of ``items`` that run once (the consumer runs until stopped).
ONE_SHOT = ("declare", "undeclare", "aside", "retry_aside")
#: What to check when the wait ends without Redis.
FIX = (
    f"Check that redis-server is running there, or give its address with --redis-url or "
    f"${REDIS_URL_ENV}; the consumer waits HA_START_TIMEOUT seconds for it (-s "
    f"HA_START_TIMEOUT=SECONDS, 0: no wait)"
)


class StoppedWaiting(Exception):
    """Ctrl-C or SIGTERM came while the consumer waited for Redis; *code*: its exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def consumes(args: argparse.Namespace) -> bool:
    """Whether *args* runs the item consumer (``items`` with no other action)."""
    if args.command != "items":
        return False
    return not any(getattr(args, a, False) for a in ONE_SHOT)


async def wait_for_redis(
    settings: BaseSettings, url: str, reach: Callable[[float], Awaitable[Any]]
) -> Any:
    """The client *reach* made (given the seconds each attempt may take) once Redis
    answered, waited for as a worker waits (see the module's docstring)."""
    limits = StartWaitConfig.from_settings(settings)
    halt, stops = Halt(), list[int]()
    loop = asyncio.get_running_loop()
    # (the CLI's own SIGINT handler, which remove_signal_handler would not put back)
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, _stop, halt, stops, sig)
    try:
        wait = StartWait(limits, url, halt, fix=FIX)
        client = await wait.run(lambda: reach(limits.connect_timeout))
        if halt.stopped:  # came as Redis answered (that step ran to its end)
            with contextlib.suppress(*REDIS_DOWN_ERRORS):
                await client.aclose()
            raise wait.stopped()
        return client
    except StoppedAtStart as exc:
        name = signal.Signals(stops[0]).name
        raise StoppedWaiting(f"{name}: {exc}; nothing was consumed", 128 + stops[0]) from None
    finally:
        for sig, handler in before.items():
            loop.remove_signal_handler(sig)
            if handler is not None:  # (None: one set from outside Python)
                signal.signal(sig, handler)


def _stop(halt: Halt, stops: list[int], sig: int) -> None:
    stops.append(sig)
    halt.stop()
