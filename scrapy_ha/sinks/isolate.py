"""Which entries a sink cannot write, with proof: the suspects of one consumer.

An entry is a suspect once it failed alone (a batch that failed is written in halves, down
to single entries, so that every entry the sink can write commits and is acknowledged). A
suspect is set aside only after it failed alone :data:`PROVEN_FAILURES` times with an error
that is not transient (:mod:`.faults`), **each failure followed by another entry committing
in the same sink**: the sink demonstrably works while this entry fails. Only a write that
stored an entry is proof: one whose entries were all dropped (``DropItem``) or left out is
not (a sink's ``write`` returns how many it stored). A sink down for
everything, or a stream with nothing else left to write, proves nothing: its suspects stay
pending (a WARNING says so, at most every :data:`WARN_EVERY` seconds per entry) and are
written once the sink takes them. One exception, the crawl's last item: when this consumer
has committed a stored write since its start, exactly one suspect is left, it is all that is
pending to the consumer and no new entry comes, it is set aside without that proof once it
failed alone :data:`PROVEN_FAILURES` times with the entry's own fault (SQLSTATE 22 or 23, an
``IntegrityError`` or ``DataError``: :mod:`.faults`). Never when every entry this consumer
saw failed: a table that refuses everything (a broken trigger raising SQLSTATE 23) is the
sink's fault, and its entries stay pending.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = ["PROVEN_FAILURES", "Suspect", "Suspects"]

#: Failures alone, each followed by another entry's commit, before an entry is set aside:
#: the dead-letter rule of the requests (3 lease expiries, Sidekiq Pro's 3).
PROVEN_FAILURES = 3
#: Seconds between two WARNINGs about one entry that keeps failing without proof.
WARN_EVERY = 60.0


@dataclass
class Suspect:
    """An entry that failed alone and is not set aside yet."""

    shard: int
    reason: str  #: its latest error
    failures: int = 0  #: failures alone that were not transient
    entry_faults: int = 0  #: those the entry's own fault (a constraint, a value: .faults)
    proven: int = 0  #: those followed by another entry's commit
    awaiting: bool = False  #: failed alone since the last commit of another entry
    warned: float = float("-inf")  #: when the last WARNING about it was logged (monotonic)

    def warn_due(self) -> bool:
        """Whether a WARNING about it is due (and is now logged)."""
        now = time.monotonic()
        if now - self.warned < WARN_EVERY:
            return False
        self.warned = now
        return True


class Suspects:
    """The suspects of one consumer, by entry id (as sinks see it: ``<shard>:<id>`` for
    shards 1 and up)."""

    def __init__(self) -> None:
        self._by_id: dict[str, Suspect] = {}

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._by_id

    def __len__(self) -> int:
        return len(self._by_id)

    def __bool__(self) -> bool:
        return bool(self._by_id)

    def failed(
        self, entry_id: str, shard: int, reason: str, *, entry_fault: bool = False
    ) -> Suspect:
        """*entry_id* failed alone, not transiently (*entry_fault*: with an error that is the
        entry's own, :data:`.faults.Fault.ENTRY`): counted, waiting for proof."""
        suspect = self._by_id.setdefault(entry_id, Suspect(shard, reason))
        suspect.reason = reason
        suspect.failures += 1
        suspect.entry_faults += entry_fault
        suspect.awaiting = True
        return suspect

    def committed(self, entry_ids: list[str], *, proof: bool = True) -> list[tuple[str, Suspect]]:
        """*entry_ids* committed: with *proof* (the sink stored at least one of them: a
        write whose entries were all dropped or left out proves nothing), each other suspect
        that failed since gets its proof; return those proven :data:`PROVEN_FAILURES` times
        (to set aside)."""
        for entry_id in entry_ids:
            self._by_id.pop(entry_id, None)  # it went in after all
        ready: list[tuple[str, Suspect]] = []
        if not proof:
            return ready
        for entry_id, suspect in self._by_id.items():
            if suspect.awaiting:
                suspect.awaiting = False
                suspect.proven += 1
                if suspect.proven >= PROVEN_FAILURES:
                    ready.append((entry_id, suspect))
        return ready

    def unprovable(self, shard: int, pending: int, *, stored: bool) -> list[tuple[str, Suspect]]:
        """The suspect of *shard* to set aside without proof, when *pending* entries are
        pending to this consumer there and no new one comes: only if the consumer *stored*
        an entry since its start, and the one suspect left is all that is pending (the
        crawl's last item), once it failed alone :data:`PROVEN_FAILURES` times with the
        entry's own fault."""
        if not stored or pending != 1 or len(self._by_id) != 1:
            return []
        mine = [(i, s) for i, s in self._by_id.items() if s.shard == shard]
        return [(i, s) for i, s in mine if s.entry_faults >= PROVEN_FAILURES]

    def forget(self, entry_id: str) -> None:
        """*entry_id* is set aside, or no longer this consumer's."""
        self._by_id.pop(entry_id, None)
