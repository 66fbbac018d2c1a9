"""How a lease ends otherwise than by an ack, and what Redis reports about leases.

A retry moves the entry to the delayed set, a permanent failure to the dead-letter queue,
a request of a closed domain is deferred without an attempt; an expired lease is reclaimed
(or dead-lettered as poison), an unreadable entry is dead-lettered as corrupt. Every one of
these is fenced by the lease token, and a failure to end one entry costs that entry alone.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import TYPE_CHECKING, TypedDict

from redis.exceptions import OutOfMemoryError

from scrapy_ha import metakeys
from scrapy_ha.codec import CodecError, Refused, encode_request
from scrapy_ha.config.validate import ConfigError
from scrapy_ha.deadletters.alerts import DeadLetterAlert
from scrapy_ha.deadletters.archiver import Archiver
from scrapy_ha.scheduler.session.aside import crawl_id, set_aside
from scrapy_ha.scheduler.session.connect import say_set_aside
from scrapy_ha.scheduler.session.rejected import Rejections
from scrapy_ha.scheduler.session.revisit import end_revisit
from scrapy_ha.store.bloom import DupefilterRefused
from scrapy_ha.store.connection import REDIS_DOWN_ERRORS, display_url
from scrapy_ha.store.dictionary import GONE_DELAY
from scrapy_ha.store.sharding import say_single_set, single_set_beside
from scrapy_ha.verdict import SITE_ANSWERS, WAIT_CLASSES, FailureClass, Verdict

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Spider
    from scrapy.settings import BaseSettings
    from scrapy.statscollectors import StatsCollector

    from scrapy_ha.config.scheduler import DeadLetterConfig, SchedulerConfig
    from scrapy_ha.scheduler.outbox import EndOp
    from scrapy_ha.store.queue import RedisQueue
    from scrapy_ha.store.wire import Lease, SyncResult

logger = logging.getLogger(__name__)

#: Why an unreadable lease waits (its held mark), and for how long (ms): see unreadable.
WAITS, WAIT_MS = "dictionary", int(GONE_DELAY * 1000)


class _Retention(TypedDict):
    max_entries: int
    max_age_ms: int


def kept(exc: Exception) -> bool:
    """After these an operation is kept and retried (Redis away or over its maxmemory, or a
    key of the wrong type that the loop sets aside first), or given back as the worker
    stops (settings Redis refused: see .refusal); any other error costs the entry alone."""
    if isinstance(exc, (*REDIS_DOWN_ERRORS, DupefilterRefused, OutOfMemoryError)):
        return True
    return "WRONGTYPE" in str(exc)


class Ends:
    """Ends leases in Redis (retry, dead letter, deferral, reclaim) and counts the result."""

    def __init__(
        self,
        stats: StatsCollector,
        config: DeadLetterConfig,
        settings: BaseSettings | None = None,
    ) -> None:
        self.stats = stats
        self.config = config
        # the SQL archive and the webhook alert, when the settings ask for them; a bad
        # setting is raised when the session connects (it stops the crawl cleanly there)
        self.archiver: Archiver | None = None
        self.alert: DeadLetterAlert | None = None
        self.setup_error: ConfigError | None = None
        if settings is not None:
            try:
                self.archiver = Archiver.from_settings(settings, stats)
                self.alert = DeadLetterAlert.from_settings(settings, stats)
            except ConfigError as exc:
                self.setup_error = exc
        if self.alert is not None:
            self.alert.warn_if_unreachable(config.max_entries, archive=self.archiver is not None)
        self.queue: RedisQueue | None = None  # set once connected
        self.spider: Spider | None = None
        #: a retry's or a revisit's stored form, compacted (the worker's Compactor.pending)
        self.compact: Callable[[bytes], bytes] = bytes
        #: leased and unreadable (or refused), to dead-letter: (lease, reason, class)
        self.corrupt: list[tuple[Lease, str, str]] = []
        #: server times of sync calls that set entries aside as corrupt (to archive, alert)
        self.set_aside_at: list[int] = []
        self._dlq_warned = False
        # what Redis refused, said once a minute
        self.rejected = Rejections(stats, display_url(settings) if settings is not None else "")
        self._last_reclaim = 0.0
        self._reclaim_from = 0.0  # monotonic time before which this worker does not reclaim
        self._said_single = False  # a single set beside the buckets (an older worker)
        self.visits = 0  # revisits ended as visits done, not counted in the rate yet

    async def end_ops(self, ops: list[EndOp], n_ops: int) -> None:
        """End the first *n_ops* finished leases; a failure costs that entry alone."""
        if n_ops:
            await self._archive_ready()
        for op in ops[:n_ops]:
            try:
                await self.end(op)
            except Exception as exc:
                if kept(exc):
                    raise
                await self._end_failed(op, exc)
            ops.remove(op)

    async def _end_failed(self, op: EndOp, exc: Exception) -> None:
        """Dead-letter an entry whose retry or dead-letter failed, with the reason."""
        assert self.queue is not None
        reason = f"scrapy-ha could not {op.kind} it: {type(exc).__name__}: {exc}"
        what = (op.kind, op.request, reason)
        self.stats.inc_value("ha/op_errors")
        info = {"class": "error", "reason": reason}
        named = crawl_id(self.queue, op.entry_id)  # (before it ends: see crawl_id)
        try:
            size = await self.queue.dead_letter(
                op.entry_id, op.token, info, **self._dlq_retention()
            )
        except Exception as exc2:
            if kept(exc2):
                raise
            msg = "Could not %s %s (%s) nor dead-letter it (%s): its lease is left to expire"
            logger.error(msg, *what, exc2)
            return
        if not size:  # expired (another worker redoes it), or ended by the attempt that failed
            logger.warning("Could not %s %s (%s) nor dead-letter it: its lease had ended", *what)
            return
        self.stats.inc_value("ha/dead/error")
        logger.error("Dead-lettered %s (class error): %s", op.request, reason)
        self._check_dlq_size(size)
        await self._dead_lettered([named])

    async def end(self, op: EndOp) -> None:
        """A lease that ends in the delayed set or the dead-letter queue (fenced)."""
        assert self.queue is not None
        if op.kind == "defer":
            due = await self.queue.retry_later(op.entry_id, op.token, int(op.delay * 1000), b"")
            self.stats.inc_value("ha/deferred" if due else "ha/stale_acks")
            return
        if op.kind == "revisit":  # a visit done counts as an ack (this worker's pages/s)
            self.visits += await end_revisit(self.queue, self.spider, op, self.stats, self.compact)
            return
        payload = encode_request(op.request, self.spider)
        verdict = Verdict.from_meta(op.request.meta)
        if op.kind == "retry":  # (waiting for a proxy or a gate: no attempt, no retry)
            gate = verdict is not None and verdict.failure_class == FailureClass.GATE
            waits = gate or (verdict is not None and verdict.failure_class in WAIT_CLASSES)
            delay_ms = int(((verdict and verdict.delay) or 0) * 1000)
            prio = op.request.priority if op.priority is None else op.priority
            fclass = "" if waits else str(verdict.failure_class if verdict else "unknown")
            args = (op.entry_id, op.token, delay_ms, self.compact(payload), prio, fclass)
            due = await self.queue.retry_later(*args, held="gate" if gate else "proxy")
            done = ("ha/deferred" if gate else "ha/proxy/waits") if waits else "ha/retry/delayed"
            self.stats.inc_value(done if due else "ha/stale_acks")
            return
        await self._dead_letter(op, verdict, payload)

    async def _dead_letter(self, op: EndOp, verdict: Verdict | None, payload: bytes) -> None:
        assert self.queue is not None
        history = op.request.meta.get(metakeys.HISTORY) or []
        info = {**(verdict.as_dict() if verdict else {}), "history": history}
        info.pop("op", None)
        if history:
            info["first"] = history[0]["t"]
        named = crawl_id(self.queue, op.entry_id)  # (before it ends: see crawl_id)
        size = await self.queue.dead_letter(
            op.entry_id, op.token, info, payload=payload, **self._dlq_retention()
        )
        if not size:
            self.stats.inc_value("ha/stale_acks")
            return
        fclass = str(verdict.failure_class) if verdict else "unknown"
        handled = verdict is not None and verdict.errback  # the spider's errback handled it
        self.stats.inc_value(f"ha/dead/{fclass}")
        logger.log(
            logging.INFO if handled or fclass in SITE_ANSWERS else logging.ERROR,
            "Dead-lettered %s (class %s): %s after %d attempt(s)%s",
            op.request,
            fclass,
            verdict.reason if verdict else None,
            len(history) or 1,
            "; the spider's errback handled it" if handled else "",
        )
        self._check_dlq_size(size)
        await self._dead_lettered([named])

    async def _archive_ready(self) -> None:
        """Declare the SQL archive in Redis before the first dead letter (or trim)."""
        if self.archiver is not None:
            assert self.queue is not None
            await self.archiver.ready(self.queue)

    async def _dead_lettered(self, ids: list[str]) -> None:
        """Archive new dead letters (in the background) and send the alert if due."""
        assert self.queue is not None
        if self.archiver is not None and ids:
            self.archiver.submit(self.queue, ids)
        if self.alert is not None and ids:
            await self.alert.check(self.queue)

    async def close(self) -> None:
        """Let the archive copies and the alert under way finish (each a bounded time)."""
        if self.archiver is not None:
            await self.archiver.close()
        if self.alert is not None:
            await self.alert.close()

    def _dlq_retention(self) -> _Retention:
        return {"max_entries": self.config.max_entries, "max_age_ms": self.config.max_age_ms}

    def _check_dlq_size(self, size: int) -> None:
        threshold = self.config.warn_threshold
        if size >= threshold and not self._dlq_warned:
            self._dlq_warned = True
            logger.warning(
                "The dead-letter queue of %s holds %d entries (HA_DLQ_WARN_THRESHOLD=%d): "
                "see `scrapy-ha dlq list %s`",
                self.spider.name if self.spider else "?",
                size,
                threshold,
                self.spider.name if self.spider else "SPIDER",
            )

    # -- unreadable entries -----------------------------------------------------------

    async def bad_data(self, exc: Exception) -> None:
        """Redis refused a command of the session's round: a key of the crawl that holds
        garbage is set aside with the reason, and the round goes on (after 1 s otherwise)."""
        assert self.queue is not None
        moved = await self.queue.set_aside_wrong_types(str(exc)) if "WRONGTYPE" in str(exc) else []
        if moved:
            self.stats.inc_value("ha/corrupt_keys", len(moved))
            say_set_aside(moved)
            return
        await self.rejected.refused(exc, self.queue.client)
        await asyncio.sleep(1)

    def unreadable(self, lease: Lease, exc: Exception, *, waits: bool = False) -> None:
        """*lease*'s payload could not be made a request (*exc*): dead-letter it at the next
        round, as ``corrupt``, or ``refused`` for a scheme outside ``HA_ALLOWED_SCHEMES``;
        one that *waits* for its dictionary (``Dictionaries.waits_for``) is delayed."""
        reason = str(exc) if isinstance(exc, CodecError) else f"{type(exc).__name__}: {exc}"
        fclass = WAITS if waits else "refused" if isinstance(exc, Refused) else "corrupt"
        self.corrupt.append((lease, reason, fclass))

    async def settle_corrupt(self) -> None:
        """End the leased entries this worker cannot read (dead-lettered, or delayed while
        their dictionary is gone), and archive and alert for those a sync call set aside."""
        while self.set_aside_at:
            await self._set_aside(self.set_aside_at[0])
            self.set_aside_at.pop(0)
        if self.corrupt:
            await self._archive_ready()
        while self.corrupt:
            lease, reason, fclass = self.corrupt[0]
            try:
                await self._end_unreadable(lease, reason, fclass)
            except Exception as exc:
                if kept(exc):
                    raise  # still held and renewed: retried next round
                logger.error(
                    "Could not end unreadable queue entry %s (%s): %s; its lease is left to expire",
                    lease.id,
                    reason,
                    exc,
                )
            self.corrupt.pop(0)

    async def _end_unreadable(self, lease: Lease, reason: str, fclass: str) -> None:
        assert self.queue is not None
        if fclass == WAITS:  # (its dictionary is gone for now: it waits, no attempt spent)
            due = await self.queue.retry_later(lease.id, lease.token, WAIT_MS, b"", held=WAITS)
            return self.stats.inc_value("ha/dictionary_waits" if due else "ha/stale_acks")
        info = {
            "class": fclass,
            "reason": f"{fclass} queue entry: {reason}",
            "payload": lease.payload[:200].decode("utf-8", "replace"),
        }
        named = crawl_id(self.queue, lease.id)  # (before it ends: see crawl_id)
        if await self.queue.dead_letter(lease.id, lease.token, info, **self._dlq_retention()):
            await self._dead_lettered([named])
        self.stats.inc_value(f"ha/dead/{fclass}")
        logger.error(
            "Queue entry %s is %s (%s): moved to the dead-letter queue", lease.id, fclass, reason
        )

    async def _set_aside(self, now_ms: int | None = None, newest: int = 0) -> None:
        """A script set entries aside as corrupt and reported only how many: archive them
        and send the alert if due, as for every other dead letter. They are found by their
        dead-letter time, the script's time *now_ms* when the reply has it, else among the
        *newest* dead letters (with room for those other workers made meanwhile)."""
        if self.archiver is None and self.alert is None:
            return
        await self._archive_ready()
        assert self.queue is not None
        await self._dead_lettered(await set_aside(self.queue, now_ms, newest))

    # -- expired leases ---------------------------------------------------------------

    def hold_reclaim(self, seconds: float | None) -> None:
        """No reclaim for *seconds* from now (None: until told again). After an outage
        every worker's leases have expired in Redis; each worker renews its own within a
        lease period of coming back, and only then may their expiry mean a dead worker:
        reclaiming at once would give away (and redo) work that live workers finished."""
        self._reclaim_from = math.inf if seconds is None else time.monotonic() + seconds

    async def reclaim_if_due(self, config: SchedulerConfig, now: float) -> None:
        """Reclaim once per ``HA_RECLAIM_INTERVAL`` (the script's guard makes that once per
        interval across workers), unless held (see :meth:`hold_reclaim`)."""
        if now >= self._reclaim_from and now - self._last_reclaim >= config.reclaim_interval:
            self._last_reclaim = time.monotonic()
            await self.reclaim(config)

    async def reclaim(self, config: SchedulerConfig) -> None:
        assert self.queue is not None
        await self._archive_ready()
        result = await self.queue.reclaim(
            worker=config.worker_id,
            interval_ms=int(config.reclaim_interval * 1000),
            batch=config.reclaim_batch,
            max_expiries=config.max_lease_expiries,
            **self._dlq_retention(),
        )
        if result is None:
            return
        reclaimed, poison, set_aside, now_ms = result
        if set_aside:
            self.stats.inc_value("ha/dead/corrupt", set_aside)
            logger.error(
                "%d leased entr(ies) had an unreadable lease record: moved to the "
                "dead-letter queue as corrupt",
                set_aside,
            )
            await self._set_aside(now_ms, newest=set_aside)
        if reclaimed:
            self.stats.inc_value("ha/reclaimed", reclaimed)
            logger.warning("Reclaimed %d expired lease(s) back to the queue", reclaimed)
        for entry_id in poison:
            self.stats.inc_value("ha/dead/poison")
            logger.error(
                "Request %s dead-lettered as poison: its lease expired %d times",
                entry_id,
                config.max_lease_expiries,
            )
        await self._dead_lettered(poison)
        # after what the reclaim did is said (a conversion that fails on garbage must not
        # hide it): a worker of a version before the back queues beside this one (a
        # rolling upgrade) stores pending in the old sorted set, which converts at start
        # only; one before the buckets (Bloom filter, time slices) writes a single set
        await self.queue.upgrade()
        if not self._said_single and (found := await single_set_beside(self.queue)):
            self._said_single = True
            say_single_set(*found)

    def count(self, result: SyncResult, sent: int) -> None:
        """Count what a sync did (enqueued, filtered, acked, stale, refused, set aside)."""
        inc = self.stats.inc_value
        if sent:
            inc("ha/enqueued", result.added)
            if sent - result.added:
                inc("ha/filtered", sent - result.added)
                inc("dupefilter/filtered", sent - result.added)
        if result.acked:
            inc("ha/acked", result.acked)
        if result.stale:
            inc("ha/stale_acks", result.stale)
            logger.warning(
                "%d ack(s) refused: their leases had expired and were reclaimed", result.stale
            )
        if result.refused:
            inc("ha/children_refused", result.refused)
            logger.warning(
                "%d request(s) refused: the lease of the page that yielded them had "
                "expired and was reclaimed (another worker redoes that page)",
                result.refused,
            )
        if result.set_aside:
            self.set_aside_at += result.set_aside_at or [result.now_ms]
            inc("ha/dead/corrupt", result.set_aside)
            logger.error(
                "%d pending entr(ies) without an entry id moved to the dead-letter "
                "queue as corrupt",
                result.set_aside,
            )
        if result.leases:
            inc("ha/leased", len(result.leases))
