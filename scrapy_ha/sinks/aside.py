"""Setting aside the entries a sink can never write: each costs that entry alone.

The guarantee: **an entry is set aside only once it has failed alone** (written as a batch of
one, every entry before it in its batch committed or set aside already) **N times in a row
(``aside_after``, 3) with an error the sink does not call retryable**; every other entry is
written exactly once, as before, and a sink that fails for a reason of its own (down, busy,
rate-limited: a retryable error) sets nothing aside.

How: a batch the sink fails with a retryable error stays pending, as before (delivered again
after a pause). A batch that fails otherwise is cut in two, and each half is written and
acknowledged exactly as a batch is (the sink's own commit: the JSON Lines file's offset
record, an SQL transaction; then XACK), the first half before the second; a half that fails
is cut again, down to a batch of one. That one is tried again after a pause (``pause`` times
its failures so far) until it commits, fails with a retryable error (it stays pending, with
the entries after it), or has failed alone N times: then it is copied with its reason to the
crawl's ``items_aside`` stream and acknowledged in its group, in one call that only the
consumer it is pending to can make (``lua/items_aside.lua``); the entries after it go on. A
SIGKILL at any point of this is a kill mid-batch: what the sink committed is acknowledged
(by the consumer started again, from the sink's record), the rest is delivered again.

Retryable: :class:`RetryLater` (a pipeline's "not now": an API answering 429), ``OSError``
(a lost or refused connection, a timeout, a full disk), Redis going away, and whatever the
sink's own ``retryable(exc)`` says (the SQL sink: a database that is unreachable or busy).
Anything else counts against the entry, once it has failed alone.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Protocol

from scrapy_ha.codec.masking import mask_text
from scrapy_ha.store.connection import REDIS_DOWN_ERRORS

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

__all__ = [
    "DEFAULT_ALONE_PAUSE",
    "DEFAULT_ASIDE_AFTER",
    "PartialWrite",
    "RetryLater",
    "Triage",
    "reason",
    "retryable",
]

logger = logging.getLogger(__name__)

#: Failures alone before an entry is set aside: Sidekiq Pro's poison count (DESIGN.md), and
#: with the pauses between them an error that depends on timing has 1.5 s to pass.
DEFAULT_ASIDE_AFTER = 3
#: Seconds before an entry that failed alone is tried again, times its failures so far.
DEFAULT_ALONE_PAUSE = 0.5
#: Characters of the sink's error kept as the reason of an entry set aside.
REASON_CHARS = 1000


class RetryLater(Exception):  # noqa: N818 - it says what the sink wants
    """Raise it from a sink's ``write`` (a pipeline's ``process_item``) when the item cannot
    be written *now* (an API answering 429, a service down): the entry stays pending and is
    delivered again after a pause, and never counts toward its set-aside."""


class PartialWrite(Exception):  # noqa: N818 - it says what happened
    """Raised by a sink that commits entry by entry (the pipelines) from the error of entry
    number *done* (``raise PartialWrite(done) from exc``): the *done* entries before it are
    committed, the ones after it untouched."""

    def __init__(self, done: int) -> None:
        super().__init__(f"the sink committed {done} entries of the batch, then failed")
        self.done = done


class _Entry(Protocol):
    @property
    def id(self) -> str: ...


class _Sink(Protocol):
    async def write(self, entries: list[Any]) -> None: ...


#: Errors that say "not now", whatever the sink: they never count against an entry.
RETRYABLE: tuple[type[BaseException], ...] = (RetryLater, OSError, *REDIS_DOWN_ERRORS)


def retryable(sink: Any, exc: BaseException) -> bool:
    """Whether *exc* says the sink cannot write now (rather than that the entry is bad)."""
    own = getattr(sink, "retryable", None)
    return isinstance(exc, RETRYABLE) or bool(own is not None and own(exc))


def reason(exc: BaseException) -> str:
    """What an entry set aside failed with: the sink's error, credentials masked, cut short."""
    return mask_text(f"{type(exc).__name__}: {exc}")[:REASON_CHARS]


def _cause(exc: BaseException) -> BaseException:
    return exc.__cause__ or exc if isinstance(exc, PartialWrite) else exc


class Triage:
    """Settles the batches *sink* fails: *commit* acknowledges entries the sink committed,
    *set_aside* sets one aside (with its reason and failures alone)."""

    def __init__(
        self,
        sink: _Sink,
        commit: Callable[[list[Any]], Awaitable[None]],
        set_aside: Callable[[Any, str, int], Awaitable[None]],
        *,
        after: int = DEFAULT_ASIDE_AFTER,
        pause: float = DEFAULT_ALONE_PAUSE,
    ) -> None:
        self.sink, self.commit, self.set_aside = sink, commit, set_aside
        self.after, self.pause = after, pause
        #: entry id -> its failures alone in a row (in this process: a consumer started
        #: again counts from 0, which only delays a set-aside)
        self.failures: dict[str, int] = {}

    async def settle(self, entries: list[Any], exc: BaseException) -> bool:
        """The sink failed *entries* (in order) with *exc*: commit what it can, set aside
        what it never can. False when some stay pending (retryable: delivered again)."""
        if isinstance(exc, PartialWrite) and entries:
            await self.commit(entries[: exc.done])
            entries = entries[exc.done :]
            if not entries:
                return True
            return await self._alone(entries[0], _cause(exc)) and await self._write(entries[1:])
        if retryable(self.sink, exc):
            return False
        if len(entries) == 1:
            return await self._alone(entries[0], exc)
        middle = (len(entries) + 1) // 2
        return await self._write(entries[:middle]) and await self._write(entries[middle:])

    async def _write(self, entries: list[Any]) -> bool:
        """Write *entries* as a batch (committed and acknowledged), or settle them."""
        exc = await self._try(entries) if entries else None
        return exc is None or await self.settle(entries, exc)

    async def _try(self, entries: list[Any]) -> BaseException | None:
        try:
            await self.sink.write(entries)
        except Exception as exc:  # noqa: BLE001 - whatever the sink raises, the write failed
            return exc
        await self.commit(entries)  # a Redis error here goes up: nothing more is written
        return None

    async def _alone(self, entry: _Entry, exc: BaseException) -> bool:
        """*entry* failed alone with *exc*: tried again until it commits, fails with a
        retryable error (False: it stays pending), or is set aside."""
        while True:
            exc = _cause(exc)
            if self.after <= 0 or retryable(self.sink, exc):
                return False
            failures = self.failures[entry.id] = self.failures.get(entry.id, 0) + 1
            why = reason(exc)
            logger.warning("Stream entry %s failed alone (%d): %s", entry.id, failures, why)
            if failures >= self.after:
                del self.failures[entry.id]
                await self.set_aside(entry, why, failures)
                return True
            await asyncio.sleep(self.pause * failures)
            found = await self._try([entry])
            if found is None:
                self.failures.pop(entry.id, None)
                return True
            exc = found
