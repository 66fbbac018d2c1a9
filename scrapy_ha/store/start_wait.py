"""Waiting for Redis at start, as a running worker waits for it once it lost Redis.

A Scrapy worker (``scrapy_ha.Scheduler``) and the item consumer (``scrapy-ha items``) are
long-running services: started before their Redis (a container up first, a Redis
restarting or failing over), each waits for it, bounded by ``HA_START_TIMEOUT``, then
fails naming the URL (password masked). A stop that comes while one waits (Ctrl-C,
SIGTERM, scrapyd's cancel) cuts the wait short with :class:`StoppedAtStart`, which says
that it never reached Redis: the caller ends as a start that failed, not as a clean run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Protocol, TypeVar

import redis

from scrapy_ha.store.connection import (
    CHECK_REDIS,
    REDIS_DOWN_ERRORS,
    RedisDown,
    RedisUnavailable,
    down_reason,
    jittered,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

__all__ = [
    "FIRST_RETRY_DELAY",
    "STOP_STEP_GRACE",
    "Halt",
    "StartLimits",
    "StartWait",
    "StoppedAtStart",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")
#: First wait between two attempts to reach Redis at start; it doubles up to
#: HA_RECONNECT_MAX_DELAY, as a running worker's does.
FIRST_RETRY_DELAY = 0.25
#: Seconds a step of the start on a Redis that answered may still take once a stop came: a
#: Redis that answers answers it in milliseconds; one stopped or frozen since would hold
#: the stop for HA_CONNECT_TIMEOUT (or for ever, without a socket timeout).
STOP_STEP_GRACE = 2.0


class StartLimits(Protocol):
    """What bounds a start wait (``HA_CONNECT_TIMEOUT``, ``HA_START_TIMEOUT``,
    ``HA_RECONNECT_MAX_DELAY``, in seconds)."""

    @property
    def connect_timeout(self) -> float: ...
    @property
    def start_timeout(self) -> float: ...
    @property
    def reconnect_max_delay(self) -> float: ...


class StoppedAtStart(RedisUnavailable):
    """A stop came while the start waited for a Redis that had not answered yet."""


class Halt:
    """Where a stop can cut a start wait short: the task that runs a step or waits now, and
    whether a stop came. A step on a Redis that answered is given *grace* seconds to end
    (a write under way is let through), a wait or a step before Redis answered none."""

    def __init__(self) -> None:
        self.stopped = False
        self._task: asyncio.Task[object] | None = None
        self._grace = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._cut = False  # this halt cancelled the task

    def stop(self) -> None:
        """A stop came: the step or wait under way (if any) ends with
        :class:`StoppedAtStart`, at once or after its grace."""
        if self.stopped:
            return
        self.stopped = True
        if self._task is not None:
            self._cut_after(self._grace)

    def running(self, task: asyncio.Task[object], grace: float) -> None:
        self._task, self._grace = task, grace

    def done(self) -> None:
        """The step or wait ended; a cancellation of this halt's that the step swallowed
        (it ended all the same) is taken back: the caller checks :attr:`stopped`."""
        if self._cut and self._task is not None:
            self._cut = False
            self._task.uncancel()
        self._task = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def cut(self, task: asyncio.Task[object]) -> bool:
        """Whether *task*'s cancellation was this halt's alone (then it is taken back)."""
        if not self._cut:
            return False
        self._cut = False
        return task.uncancel() == 0

    def _cut_after(self, grace: float) -> None:
        if grace <= 0:
            self._cancel()
        else:
            self._timer = asyncio.get_running_loop().call_later(grace, self._cancel)

    def _cancel(self) -> None:
        self._timer = None
        if self._task is not None and not self._cut:
            self._cut = True
            self._task.cancel()


class StartWait:
    """Waits for Redis at start as a running worker does: a step that meets a Redis that
    does not answer (refused, timed out, loading its data, a cluster electing a primary)
    is tried again after a wait that doubles from 0.25 s up to ``HA_RECONNECT_MAX_DELAY``
    (drawn between half and the whole of it), with a WARNING each time (on *log*), until
    ``HA_START_TIMEOUT`` has passed since it began to connect; then
    :class:`RedisUnavailable` says so (*fix*: what to check). Each attempt is bounded by
    ``HA_CONNECT_TIMEOUT`` (so the last may end that much later). Refused credentials,
    and a server certificate refused for a reason waiting does not mend, are not tried
    again. A stop (*halt*) ends the wait, and an attempt before Redis first answered, with
    :class:`StoppedAtStart`; a step on a Redis that answered gets :data:`STOP_STEP_GRACE`
    seconds more, and no step starts after a stop."""

    def __init__(
        self,
        config: StartLimits,
        redis_url: str,
        halt: Halt | None = None,
        fix: str = CHECK_REDIS,
        log: logging.Logger = logger,
    ) -> None:
        self.config = config
        self.redis_url = redis_url
        self.halt = halt or Halt()
        self.fix = fix
        self.log = log
        self.started = time.monotonic()
        self.attempts = 0
        self.answered = False  # a step succeeded: Redis was reached
        self._again = False  # the last step met a Redis gone away (after it had answered)
        self._delay = 0.0

    async def run(self, step: Callable[[], Awaitable[T]]) -> T:
        """*step*'s result, once Redis answered it."""
        while True:
            self.attempts += 1
            try:
                with self._cut_short(STOP_STEP_GRACE if self.answered else 0.0):
                    result = await step()
                self.answered, self._again = True, False
                return result
            except redis.exceptions.AuthenticationError:
                raise
            except (RedisDown, *REDIS_DOWN_ERRORS) as exc:
                reason = exc.reason if isinstance(exc, RedisDown) else None
                self._again = self.answered
                with self._cut_short(0.0):
                    await self._wait(reason or down_reason(exc, self.redis_url))

    @contextlib.contextmanager
    def _cut_short(self, grace: float) -> Iterator[None]:
        """A stop that came before this (a step or a wait) starts, or that comes while it
        runs (cut after *grace* seconds), raises StoppedAtStart. A step that ended all the
        same (a cancellation lost as its reply came: CPython gh-86296) returns what it
        made: the caller checks ``halt.stopped``."""
        task = asyncio.current_task()
        assert task is not None  # (awaited in a task)
        if self.halt.stopped:
            raise self.stopped()
        self.halt.running(task, grace)
        try:
            yield
        except asyncio.CancelledError:
            if not self.halt.cut(task):  # (a cancellation of its own: the task is ending)
                raise
            raise self.stopped() from None
        finally:
            self.halt.done()

    def stopped(self) -> StoppedAtStart:
        """What a stop during the start says (the URL, the attempts, the time waited)."""
        spent = (
            f"{self.attempts} attempt(s) in {time.monotonic() - self.started:.1f} s of "
            f"HA_START_TIMEOUT={self.config.start_timeout:g}s"
        )
        if not self.answered:
            return StoppedAtStart(
                f"scrapy-ha stopped before it reached Redis at {self.redis_url}: a stop came "
                f"while it waited for Redis to answer ({spent})"
            )
        if self._again:  # (a later step of the start met a Redis gone again)
            return StoppedAtStart(
                f"scrapy-ha stopped while it waited for Redis at {self.redis_url} to answer "
                f"again (it had answered, then went away; {spent})"
            )
        return StoppedAtStart(
            f"scrapy-ha stopped before its start at Redis at {self.redis_url} was done: the "
            f"stop came after Redis answered ({spent})"
        )

    async def _wait(self, reason: str) -> None:
        cfg = self.config
        left = self.started + cfg.start_timeout - time.monotonic()
        if left <= 0:
            raise RedisUnavailable(
                f"scrapy-ha cannot reach Redis at {self.redis_url} within "
                f"HA_START_TIMEOUT={cfg.start_timeout:g}s ({self.attempts} attempt(s) of "
                f"HA_CONNECT_TIMEOUT={cfg.connect_timeout:g}s at most; the last: {reason}). "
                f"{self.fix}"
            )
        self._delay = min(cfg.reconnect_max_delay, max(FIRST_RETRY_DELAY, self._delay * 2))
        wait = min(jittered(self._delay), left)
        self.log.warning(
            "Redis at %s unreachable at start (%s); attempt %d, trying again in %.2f s "
            "(HA_START_TIMEOUT=%gs, %.1f s left)",
            self.redis_url,
            reason,
            self.attempts,
            wait,
            cfg.start_timeout,
            left,
        )
        await asyncio.sleep(wait)
