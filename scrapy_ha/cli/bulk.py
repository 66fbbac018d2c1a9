"""What the bulk actions on a large selection share (``dlq requeue|purge``, ``delayed
retry-now`` with --all or filters): they read it a batch at a time, never hold it whole.

The selection is read once to count it (and name the first few, for a dry run); its ids
go to a temporary file of the command as they are read, not to this process's memory.
What the prompt approved is that file: the action reads it a batch at a time, so an entry
that came after the count is not touched (as before, when the ids were held here),
whatever the size of the queue (a QA run: 100,000 dead letters cost 206 MB held at once;
a continuous crawl's million delayed revisits, 500 MB). Not in Redis: a purge is what an
operator runs to free a Redis that is full, which refuses every write (a review: the ids
written to a list of the crawl first, ``dlq purge --all`` failed with OutOfMemoryError).

A long count or action says how far it went on stderr every :data:`PROGRESS_EVERY`
seconds, when stderr is a terminal (as ``status --watch`` redraws only there): a script's
log gets the final count alone. (The count alone of a million entries takes a minute: it
used to say nothing meanwhile.)
"""

from __future__ import annotations

import itertools
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING

from scrapy_ha.cli.common import DRY_RUN_SHOWN

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

#: Ids read, written and acted on per round trip.
BATCH = 500
#: Seconds between two progress lines (a terminal's) of a long bulk action.
PROGRESS_EVERY = 3.0


class Progress:
    """A line on stderr every *every* seconds while a long action runs (on a terminal)."""

    def __init__(
        self, what: str, total: int | None, *, stream: IO[str] | None = None, every: float = 0.0
    ) -> None:
        self.what, self.total = what, total
        self.stream = stream or sys.stderr
        self.every = every or PROGRESS_EVERY
        self.shown = self.stream.isatty()
        self.last = time.monotonic()

    def step(self, done: int) -> None:
        if self.shown and time.monotonic() - self.last >= self.every:
            of = "so far" if self.total is None else f"of {self.total:,}"
            print(f"{self.what} {done:,} {of} ...", file=self.stream, flush=True)
            self.last = time.monotonic()


class Approved:
    """The ids of a selection, in a temporary file (deleted when closed)."""

    def __init__(self) -> None:
        self.file: IO[str] = tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115

    async def add(self, ids: list[str]) -> None:
        self.file.writelines(f"{entry_id}\n" for entry_id in ids)

    async def batches(self) -> AsyncIterator[list[str]]:
        """The ids, *BATCH* at a time, in the order they were added."""
        self.file.flush()
        self.file.seek(0)
        while ids := [line.rstrip("\n") for line in itertools.islice(self.file, BATCH)]:
            yield ids

    async def drop(self) -> None:
        self.file.close()


@dataclass
class Chosen:
    """A selection counted: how many, the first few named (what a dry run shows)."""

    count: int = 0
    shown: list[str] = field(default_factory=list)


async def choose(
    batches: AsyncIterator[list[tuple[str, str]]],
    approved: Approved | None,
    progress: Progress | None = None,
) -> Chosen:
    """Count the (id, label) pairs of *batches*, keep the first labels, and put the ids in
    *approved* (None: a dry run, which writes nothing); *progress* says how far the count
    went (by default on a terminal's stderr)."""
    chosen = Chosen()
    progress = progress or Progress("counted:", None)
    async for batch in batches:
        chosen.count += len(batch)
        progress.step(chosen.count)
        chosen.shown += [label for _, label in batch[: DRY_RUN_SHOWN - len(chosen.shown)]]
        if approved is not None:
            await approved.add([entry_id for entry_id, _ in batch])
    return chosen


async def act(
    approved: Approved, action: Callable[[list[str]], Awaitable[int]], progress: Progress
) -> int:
    """Run *action* on the approved ids, a batch at a time; return what it counted."""
    done = seen = 0
    try:
        async for ids in approved.batches():
            done += await action(ids)
            seen += len(ids)
            progress.step(seen)
    finally:
        await approved.drop()
    return done
