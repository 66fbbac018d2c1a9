"""How a lease ends otherwise than by an ack, and what Redis reports about leases.

A retry moves the entry to the delayed set, a permanent failure to the dead-letter queue,
a request of a closed domain is deferred without an attempt; an expired lease is reclaimed
(or dead-lettered as poison), an unreadable entry is dead-lettered as corrupt. Every one of
these is fenced by the lease token, and a failure to end one entry costs that entry alone.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, TypedDict

from scrapy_ha import metakeys
from scrapy_ha._connection import REDIS_DOWN_ERRORS
from scrapy_ha.codec import encode_request
from scrapy_ha.verdict import Verdict

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.statscollectors import StatsCollector

    from scrapy_ha._outbox import EndOp
    from scrapy_ha._queue import Lease, RedisQueue, SyncResult
    from scrapy_ha.config import DeadLetterConfig, SchedulerConfig

logger = logging.getLogger(__name__)


class _Retention(TypedDict):
    max_entries: int
    max_age_ms: int


def kept(exc: Exception) -> bool:
    """After these an operation is kept and retried (Redis away, or a key of the wrong type
    that the loop sets aside first); any other error costs the entry alone."""
    return isinstance(exc, REDIS_DOWN_ERRORS) or "WRONGTYPE" in str(exc)


class Ends:
    """Ends leases in Redis (retry, dead letter, deferral, reclaim) and counts the result."""

    def __init__(self, stats: StatsCollector, config: DeadLetterConfig) -> None:
        self.stats = stats
        self.config = config
        self.queue: RedisQueue | None = None  # set once connected
        self.spider: Spider | None = None
        self.corrupt: list[tuple[Lease, str]] = []  # leased, unreadable: to dead-letter
        self._dlq_warned = False

    async def end_ops(self, ops: list[EndOp], n_ops: int) -> None:
        """End the first *n_ops* finished leases; a failure costs that entry alone."""
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
        self.stats.inc_value("ha/op_errors")
        info = {"class": "error", "reason": reason}
        try:
            size = await self.queue.dead_letter(
                op.entry_id, op.token, info, **self._dlq_retention()
            )
        except Exception as exc2:
            if kept(exc2):
                raise
            logger.error(
                "Could not %s %s (%s) nor dead-letter it (%s): its lease is left to expire",
                op.kind,
                op.request,
                reason,
                exc2,
            )
            return
        if size:
            self.stats.inc_value("ha/dead/error")
            logger.error("Dead-lettered %s (class error): %s", op.request, reason)
            self._check_dlq_size(size)

    async def end(self, op: EndOp) -> None:
        """A lease that ends in the delayed set or the dead-letter queue (fenced)."""
        assert self.queue is not None
        if op.kind == "defer":
            due = await self.queue.retry_later(op.entry_id, op.token, int(op.delay * 1000), b"")
            self.stats.inc_value("ha/deferred" if due else "ha/stale_acks")
            return
        payload = encode_request(op.request, self.spider)
        verdict = Verdict.from_meta(op.request.meta)
        if op.kind == "retry":
            due = await self.queue.retry_later(
                op.entry_id,
                op.token,
                int(((verdict and verdict.delay) or 0) * 1000),
                payload,
                op.request.priority if op.priority is None else op.priority,
                failure_class=str(verdict.failure_class) if verdict else "unknown",
            )
            self.stats.inc_value("ha/retry/delayed" if due else "ha/stale_acks")
            return
        await self._dead_letter(op, verdict, payload)

    async def _dead_letter(self, op: EndOp, verdict: Verdict | None, payload: bytes) -> None:
        assert self.queue is not None
        history = op.request.meta.get(metakeys.HISTORY) or []
        info = {**(verdict.as_dict() if verdict else {}), "history": history}
        info.pop("op", None)
        if history:
            info["first"] = history[0]["t"]
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
            logging.INFO if handled else logging.ERROR,
            "Dead-lettered %s (class %s): %s after %d attempt(s)%s",
            op.request,
            fclass,
            verdict.reason if verdict else None,
            len(history) or 1,
            "; the spider's errback handled it" if handled else "",
        )
        self._check_dlq_size(size)

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

    async def settle_corrupt(self) -> None:
        while self.corrupt:
            lease, reason = self.corrupt[0]
            try:
                await self._dead_letter_corrupt(lease, reason)
            except Exception as exc:
                if kept(exc):
                    raise  # still held and renewed: retried next round
                logger.error(
                    "Could not dead-letter corrupt queue entry %s (%s): %s; its lease "
                    "is left to expire",
                    lease.id,
                    reason,
                    exc,
                )
            self.corrupt.pop(0)

    async def _dead_letter_corrupt(self, lease: Lease, reason: str) -> None:
        assert self.queue is not None
        info = {
            "class": "corrupt",
            "reason": f"corrupt queue entry: {reason}",
            "payload": lease.payload[:200].decode("utf-8", "replace"),
        }
        await self.queue.dead_letter(lease.id, lease.token, info, **self._dlq_retention())
        self.stats.inc_value("ha/dead/corrupt")
        logger.error(
            "Queue entry %s is corrupt (%s): moved to the dead-letter queue", lease.id, reason
        )

    # -- expired leases ---------------------------------------------------------------

    async def reclaim(self, config: SchedulerConfig) -> None:
        assert self.queue is not None
        result = await self.queue.reclaim(
            worker=config.worker_id,
            interval_ms=int(config.reclaim_interval * 1000),
            batch=config.reclaim_batch,
            max_expiries=config.max_lease_expiries,
            **self._dlq_retention(),
        )
        if result is None:
            return
        reclaimed, poison, set_aside = result
        if set_aside:
            self.stats.inc_value("ha/dead/corrupt", set_aside)
            logger.error(
                "%d leased entr(ies) had an unreadable lease record: moved to the "
                "dead-letter queue as corrupt",
                set_aside,
            )
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
            inc("ha/dead/corrupt", result.set_aside)
            logger.error(
                "%d pending entr(ies) without an entry id moved to the dead-letter "
                "queue as corrupt",
                result.set_aside,
            )
        if result.leases:
            inc("ha/leased", len(result.leases))
