"""Finding, in a batch its sink failed, the entries the sink cannot write.

The guarantee: **an entry the sink cannot write costs that entry alone**, and **a sink that
cannot write anything (a database that is down) sets nothing aside**. After a batch fails,
its entries are written again one by one: those the sink commits are acknowledged, and one
that fails is set aside (copied with its reason to the crawl's ``items_aside`` stream and
acknowledged in the group, ``lua/items_aside.lua``) once it has **failed on its own twice,
the sink having committed other entries between the two failures**: the sink was up, and
it is the entry. The second try comes at once when other entries of the same batch were
committed after the first, else when the consumer tries the entry again after it committed
others. An entry whose failures had no commit in between stays pending and is tried again
after a pause, as a failed batch was before; so do the entries of a pass whose first
:data:`PROBES` entries all failed and none committed (the sink fails everything: it is
down, and trying the rest one by one would only wait on it longer).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from scrapy_ha.codec.masking import mask_text

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["PROBES", "PartialWrite", "Sorted", "Triage"]

logger = logging.getLogger(__name__)

#: Entries tried on their own, all failed and none committed, before a pass stops: the sink
#: fails everything (it is down). Three tell a sink that is down from one bad entry, or two
#: in a row, at a cost of three failed writes.
PROBES = 3
#: Characters of an error kept as the reason of an entry set aside.
REASON_CHARS = 1000


class Entry(Protocol):
    """What triage reads of an entry (:class:`scrapy_ha.sinks.consumer.Entry`)."""

    @property
    def id(self) -> str: ...


class Sink(Protocol):
    """What triage calls of a sink (:class:`scrapy_ha.sinks.consumer.Sink`)."""

    async def write(self, entries: list[Any]) -> None: ...


class PartialWrite(Exception):  # noqa: N818 - it says what happened, not that it is an error
    """Raised by a sink's ``write`` from the error of entry number *done* (``raise
    PartialWrite(done) from exc``): it committed the *done* entries before it, and nothing
    after. A sink that commits entry by entry (the project's pipelines) raises it, so that
    the entries it committed are not written again."""

    def __init__(self, done: int) -> None:
        super().__init__(f"the sink committed {done} entries of the batch, then failed")
        self.done = done


@dataclass
class Sorted:
    """A failed batch, sorted."""

    committed: list[Any] = field(default_factory=list)  #: the consumer's Entry objects
    #: entries to set aside, with their reason
    poison: list[tuple[Any, str]] = field(default_factory=list)
    #: entries left pending: tried again after a pause
    waiting: int = 0


def reason(exc: BaseException) -> str:
    """What an entry set aside failed with: the sink's own error, masked, cut short."""
    cause = exc.__cause__ if isinstance(exc, PartialWrite) and exc.__cause__ else exc
    return mask_text(f"{type(cause).__name__}: {cause}")[:REASON_CHARS]


class Triage:
    """Sorts the batches *sink* fails, remembering when each entry last failed on its own."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        #: entries the sink committed in this run: tells whether it committed others since
        self.commits = 0
        #: entry id -> ``commits`` when it last failed on its own
        self._failed_at: dict[str, int] = {}

    async def sort(self, entries: list[Any], exc: BaseException) -> Sorted:
        """Write the entries of a batch that failed with *exc* one by one."""
        done = exc.done if isinstance(exc, PartialWrite) else 0
        out = Sorted(committed=entries[:done])
        self.commits += done
        failed: list[tuple[Entry, str]] = []
        rest = entries[done:]
        if isinstance(exc, PartialWrite) and rest:  # the next entry failed on its own
            self._failed(rest[0], reason(exc), out, failed)
            rest = rest[1:]
        for i, entry in enumerate(rest):
            if len(failed) >= PROBES and not out.committed:
                out.waiting += len(rest) - i  # the sink fails everything: it is down
                break
            await self._try(entry, out, failed)
        for entry, _ in failed:  # others committed after it failed: once more, at once
            if self._failed_at.get(entry.id, self.commits) < self.commits:
                await self._try(entry, out, [])
        out.waiting += sum(1 for e, _ in failed if e.id in self._failed_at)
        return out

    async def _try(self, entry: Entry, out: Sorted, failed: list[tuple[Entry, str]]) -> None:
        try:
            await self.sink.write([entry])
        except Exception as exc:  # noqa: BLE001 - whatever the sink raises, the entry failed
            self._failed(entry, reason(exc), out, failed)
            return
        self._failed_at.pop(entry.id, None)
        self.commits += 1
        out.committed.append(entry)

    def _failed(self, entry: Entry, why: str, out: Sorted, failed: list[tuple[Entry, str]]) -> None:
        """*entry* failed on its own: set aside if the sink committed others since it last
        did, else remembered."""
        last = self._failed_at.get(entry.id)
        if last is not None and self.commits > last:
            del self._failed_at[entry.id]
            out.poison.append((entry, why))
            return
        self._failed_at[entry.id] = self.commits
        failed.append((entry, why))
        logger.warning("Stream entry %s fails on its own in the sink: %s", entry.id, why)

    def forget(self, entries: Sequence[Entry]) -> None:
        """*entries* were committed in a batch: they fail no more."""
        self.commits += len(entries)
        for entry in entries:
            self._failed_at.pop(entry.id, None)
