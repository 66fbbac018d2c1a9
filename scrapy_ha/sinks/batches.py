"""How a consumer's batch reaches its sink: committed, then acknowledged, entry by entry
when it must be.

A batch the sink commits is acknowledged whole. A batch it fails with an error that is not
transient (:mod:`.faults`) is written in halves, each committed and acknowledged exactly as
a batch is, down to single entries. A transient error is first the sink's (down: one write
per round), but it may be one item's (an API that drops the connection on it, a CHECK that
overflows): a batch failed transiently in :data:`TRANSIENT_HALVE_AFTER` rounds in a row
(whatever else committed meanwhile) is halved, one level per round, and not in a round that
already had a lone transient failure. The half written first alternates by round, and the
other is not written when nothing committed in the round: a sink down for all gets at most
two writes a round. So every entry the sink can write reaches it in the end, and only an
entry that fails alone is a suspect (:mod:`.isolate`), set aside once proven. With the
death rule (``deaths``, off by default), entries a consumer that died left pending (its own
after a restart, or those it takes over) are written one at a time, each single write
counted in Redis before it begins (``items_tries``): an entry ``deaths`` consumers died
writing is set aside too. Off by default because nothing proves a death: an entry taken
over from a consumer whose write hangs (``--claim-idle``) counts as one, and so does a
consumer a supervisor kills while the sink hangs, and the hung write may still commit the
entry it set aside (in the sink and aside).
An entry that is not an item (not UTF-8, not JSON) is set aside at once, never written.
Set-aside is one script call (``items_aside.lua``) that copies and acknowledges: the entry
is pending or aside, never both, never neither.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from scrapy_ha.codec import CodecError
from scrapy_ha.codec.items import decode_item, plain_item
from scrapy_ha.sinks.faults import Fault, classify
from scrapy_ha.sinks.isolate import PROVEN_FAILURES, Suspects

if TYPE_CHECKING:
    from scrapy import Spider

    from scrapy_ha.store.items import Delivery, ItemStream

__all__ = ["DEATHS", "BatchWriter", "ConsumerReport", "Entry"]

logger = logging.getLogger(__name__)

#: Single writes of one entry a consumer may die in (killed, or its process exiting) before
#: the entry is set aside, when the death rule is asked for (``--deaths``; off by default,
#: see the module): the requests' poison rule (3 lease expiries).
DEATHS = 3
#: Entries failing alone in a row, none committed between them, after which a consumer
#: stops cutting a batch for this round: the sink looks down (the rest stays pending).
LONE_STREAK = 2
#: The reason of an entry set aside that holds no item (written by hand without ``i``).
NO_ITEM = "the stream entry holds no item (no field 'i')"
#: Rounds in a row in which a batch failed with a transient error (other entries may have
#: committed in them), after which a failing batch is written in halves anyway, one level
#: per round: a transient error may be one item's (an API that drops the connection on it,
#: a table's CHECK raising an overflow), and must not hold back the rest for ever. A lone
#: entry's transient failure still never counts against it. Not at once: a sink down for
#: all fails transiently too, and each halving round costs it a second write.
TRANSIENT_HALVE_AFTER = 3
#: Longest pause after a round in which the sink committed nothing and failed.
FAILED_MAX_DELAY = 5.0


@dataclass(frozen=True)
class Entry:
    """One item of the stream as a sink gets it."""

    #: the entry's id, unique in the crawl: ``<ms>-<seq>``, or ``<shard>:<ms>-<seq>`` for
    #: shards 1 and up of a sharded crawl. A sink keys its writes by it.
    id: str
    #: the item as the worker's codec stored it (see :mod:`scrapy_ha.codec.items`)
    data: bytes

    def plain(self) -> Any:
        """The item as plain JSON data (no class is built)."""
        return plain_item(self.data)

    def item(self, spider: Spider | None) -> Any:
        """The item, its class built if *spider*'s process trusts it."""
        return decode_item(self.data, spider)

    @property
    def committed_ms(self) -> int:
        """When the worker's ack committed it (the Redis server's clock, ms)."""
        return int(self.id.rpartition(":")[2].partition("-")[0])


@dataclass
class ConsumerReport:
    """What one run of a consumer did."""

    consumed: int = 0  #: entries acknowledged after the sink committed them
    recovered: int = 0  #: entries committed before a restart, acknowledged at start
    claimed: int = 0  #: entries taken over from consumers that left them pending
    batches: int = 0
    errors: int = 0  #: writes the sink failed (delivered again, or cut in halves)
    lone_failures: int = 0  #: failures of an entry written alone (suspects, see .isolate)
    set_aside: int = 0  #: entries set aside (items_aside.lua)
    stuck: int = 0  #: entries left pending when --exit-idle exited (failed alone, unproven)


def global_id(shard: int, local_id: str) -> str:
    return local_id if shard == 0 else f"{shard}:{local_id}"


def route(entry_id: str) -> tuple[int, str]:
    head, sep, tail = entry_id.partition(":")
    return (int(head), tail) if sep else (0, entry_id)


class Writes(Protocol):
    """What :class:`BatchWriter` needs of a sink (:class:`~.consumer.Sink`'s ``write``)."""

    async def write(self, entries: list[Entry]) -> int | None: ...


class BatchWriter:
    """Writes one consumer's batches to *sink* and acknowledges them in *streams*
    (one per shard) for *group*."""

    def __init__(
        self,
        sink: Writes,
        streams: list[ItemStream],
        group: str,
        consumer: str,
        report: ConsumerReport,
        deaths: int = 0,
    ) -> None:
        self.sink = sink
        #: consumer deaths in single writes of an entry that set it aside (0: never)
        self.deaths = deaths
        self.streams = streams
        self.group = group
        self.consumer = consumer
        self.report = report
        #: a write failed: its entries wait among this consumer's own (pending to it)
        self.failed = False
        #: per shard, the ids of a batch the sink committed and Redis did not acknowledge
        #: (it went away meanwhile): acknowledged first when it answers, never written again
        self.unacked: dict[int, list[str]] = {}
        self.suspects = Suspects()
        self._streak = 0  #: entries failed alone since the last commit
        self._transients = 0  #: rounds in a row in which a batch failed transiently
        self._failed_rounds = 0  #: writes in a row that committed nothing and failed
        #: a write stored an entry since this consumer started (the no-proof rule's condition)
        self.stored_any = False
        self._rounds = 0
        self._halved = False  #: a batch was halved on a transient error this round
        self._lone_transient = False  #: an entry failed alone, transiently, this round
        self._transient_round = False  #: a batch failed transiently this round
        self._proven_round = False  #: a write stored an entry this round

    def new_round(self) -> None:
        """A consumer's round begins: a transient error may halve one batch level again;
        the count of transient rounds restarts after a round with none."""
        if not self._transient_round:
            self._transients = 0
        self._rounds += 1
        self._halved = self._lone_transient = False
        self._transient_round = self._proven_round = False

    async def commit(
        self, shard: int, deliveries: list[Delivery], *, restart: bool = False
    ) -> bool:
        """The sink commits the entries, then they are acknowledged; a batch that fails is
        cut in halves (:meth:`_pieces`), a suspect is written alone. Entries the sink
        failed stay pending (delivered again after a pause). With *restart* (entries a
        consumer that died left) and the death rule, one entry at a time. True if anything
        was committed."""
        entries = [Entry(global_id(shard, d.id), d.data) for d in deliveries if d.data is not None]
        gone = [d.id for d in deliveries if d.data is None]  # deleted while pending
        if gone:
            await self._acknowledge(shard, gone)
        entries = await self._readable(shard, entries)
        errors, committed, self._streak = self.report.errors, False, 0
        if restart and self.deaths:
            for entry in entries:
                if self._streak >= LONE_STREAK:  # the sink looks down: the rest waits
                    break
                committed = await self._single(shard, entry, counted=True) or committed
        else:
            committed = await self._pieces(shard, [e for e in entries if e.id not in self.suspects])
            for entry in [e for e in entries if e.id in self.suspects]:
                committed = await self._single(shard, entry) or committed
        if committed or self.report.errors == errors:
            self._failed_rounds = 0
        else:
            self._failed_rounds += 1
            await asyncio.sleep(min(FAILED_MAX_DELAY, 0.5 * self._failed_rounds))
        return committed

    async def _readable(self, shard: int, entries: list[Entry]) -> list[Entry]:
        """*entries* but those that are not an item (not UTF-8, not JSON: no sink can ever
        read them), which are set aside at once with the decoding error."""
        readable = []
        for entry in entries:
            if not entry.data:  # (store/items.py: an entry without the item's field)
                await self._set_aside(shard, entry.id, NO_ITEM, 0)
                continue
            try:
                entry.plain()
            except CodecError as exc:
                await self._set_aside(shard, entry.id, f"CodecError: {exc}", 0)
                continue
            readable.append(entry)
        return readable

    async def _pieces(self, shard: int, entries: list[Entry]) -> bool:
        """Write *entries*; if they fail with an error that is not transient, write each
        half the same way, so that every entry the sink can write commits. Stops cutting
        once :data:`LONE_STREAK` entries failed alone in a row (the sink looks down)."""
        if not entries or self._streak >= LONE_STREAK:
            return False
        exc = await self._write(shard, entries)
        if exc is None:
            return True
        if len(entries) == 1:
            self._lone_failure(entries[0], shard, exc)
            return False
        if classify(exc) is Fault.TRANSIENT:
            return await self._transient_failure(shard, entries, exc)
        logger.info(
            "The sink failed a batch of %d item(s) (%s: %s); writing it in halves",
            len(entries),
            type(exc).__name__,
            exc,
        )
        mid = len(entries) // 2
        first = await self._pieces(shard, entries[:mid])
        return await self._pieces(shard, entries[mid:]) or first

    async def _transient_failure(self, shard: int, entries: list[Entry], exc: Exception) -> bool:
        """*entries* failed transiently: they stay pending, or, once batches failed so in
        :data:`TRANSIENT_HALVE_AFTER` rounds in a row, are written in halves (one level
        per round, none in a round an entry already failed alone transiently). The half
        written first alternates by round; the other waits for the next round if nothing
        committed in this one (the sink may be down for all)."""
        if not self._transient_round:
            self._transient_round = True
            self._transients += 1
        if self._transients < TRANSIENT_HALVE_AFTER or self._halved or self._lone_transient:
            logger.warning(
                "The sink failed a batch of %d item(s) (%s: %s, transient); they stay "
                "pending and are delivered again",
                len(entries),
                type(exc).__name__,
                exc,
            )
            return False
        self._halved = True
        logger.info(
            "The sink failed a batch of %d item(s) (%s: %s, transient) in %d rounds in a "
            "row; writing it in halves",
            len(entries),
            type(exc).__name__,
            exc,
            self._transients,
        )
        mid = len(entries) // 2
        halves = [entries[:mid], entries[mid:]][:: -1 if self._rounds % 2 else 1]
        first = await self._pieces(shard, halves[0])
        if not self._proven_round:  # nothing committed: the sink may be down for all
            return first
        return await self._pieces(shard, halves[1]) or first

    async def _single(self, shard: int, entry: Entry, *, counted: bool = False) -> bool:
        """Write *entry* alone. *counted*: the write is counted in Redis before it begins
        and uncounted once it returns, so a count left is a consumer that died in it; an
        entry ``deaths`` consumers died writing is set aside instead."""
        stream, local = self.streams[shard], route(entry.id)[1]
        if counted:
            begun = await stream.begin_single(self.group, local)
            if begun > self.deaths:
                await self._set_aside(shard, entry.id, "the consumer died writing it", begun - 1)
                return False
        exc = await self._write(shard, [entry], counted=counted)
        if exc is None:
            return True
        self._lone_failure(entry, shard, exc)
        return False

    async def _write(
        self, shard: int, entries: list[Entry], *, counted: bool = False
    ) -> Exception | None:
        """One write of the sink, acknowledged once committed; its error, if it failed."""
        try:
            stored = await self.sink.write(entries)
        except Exception as exc:
            self.report.errors += 1
            self.failed = True
            return exc
        finally:
            if counted:
                await self.streams[shard].end_single(self.group, route(entries[0].id)[1])
        await self._acknowledge(shard, [route(e.id)[1] for e in entries])
        self.report.batches += 1
        proof = stored is None or stored > 0  # a write that stored nothing proves nothing
        if proof:  # the sink works; a batch failing transiently keeps its count of rounds
            self._streak = 0
            self.stored_any = self._proven_round = True
        for entry_id, suspect in self.suspects.committed([e.id for e in entries], proof=proof):
            await self._set_aside(suspect.shard, entry_id, suspect.reason, suspect.proven)
        return None

    def _lone_failure(self, entry: Entry, shard: int, exc: Exception) -> None:
        """*entry* failed alone: a suspect, unless the error is transient."""
        self._streak += 1
        self.report.lone_failures += 1
        reason, fault = f"{type(exc).__name__}: {exc}", classify(exc)
        if fault is Fault.TRANSIENT:
            self._lone_transient = True
            logger.warning(
                "Stream entry %s failed (%s, transient): it stays pending", entry.id, reason
            )
            return
        suspect = self.suspects.failed(entry.id, shard, reason, entry_fault=fault is Fault.ENTRY)
        if suspect.warn_due():
            logger.warning(
                "Stream entry %s failed alone %d time(s), %d of them while the sink committed "
                "other entries (set aside after %d): %s; it stays pending",
                entry.id,
                suspect.failures,
                suspect.proven,
                PROVEN_FAILURES,
                reason,
            )

    async def settle(self, shard: int, pending: int) -> None:
        """No new entry came in *shard* and *pending* entries are pending to this consumer
        there: if it is the one suspect left and the sink stored an entry since this consumer
        started, set it aside once it failed alone with the entry's own fault
        (:meth:`.Suspects.unprovable`)."""
        unprovable = self.suspects.unprovable(shard, pending, stored=self.stored_any)
        for entry_id, suspect in unprovable:
            await self._set_aside(shard, entry_id, suspect.reason, suspect.failures)

    async def _set_aside(self, shard: int, entry_id: str, reason: str, times: int) -> None:
        """Set *entry_id* aside with *reason* (items_aside.lua): copied, then acknowledged."""
        self.suspects.forget(entry_id)
        local = route(entry_id)[1]
        done = await self.streams[shard].set_aside(self.group, self.consumer, local, reason)
        if done != 1:  # acknowledged meanwhile, or taken over by another consumer
            return
        self.report.set_aside += 1
        logger.error(
            "Stream entry %s set aside in %s %s: %s",
            entry_id,
            self.streams[shard].keys.items_aside,
            f"after failing alone {times} time(s)" if times else "before any write",
            reason,
        )

    async def _acknowledge(self, shard: int, ids: list[str]) -> None:
        self.unacked[shard] = ids
        await self.acknowledge_committed()

    async def acknowledge_committed(self) -> None:
        """Acknowledge what the sink committed (kept if Redis fails meanwhile)."""
        for shard, ids in list(self.unacked.items()):
            acked, _ = await self.streams[shard].ack(self.group, ids)
            self.report.consumed += acked
            del self.unacked[shard]
