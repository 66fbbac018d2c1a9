"""How a revisited request's lease ends: back in the delayed set, due again after its
interval (:func:`scrapy_ha.store.revisits.revisit`), fenced by its token as a retry; the
shell decided when (:mod:`scrapy_ha.scheduler.revisits`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy_ha.codec import encode_request
from scrapy_ha.config.continuous import interval_bucket
from scrapy_ha.store.revisits import DOUBLE, LEFT, Revisit, Revisited, revisit
from scrapy_ha.store.sharding import shards_of

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Spider
    from scrapy.statscollectors import StatsCollector

    from scrapy_ha.scheduler.outbox import EndOp, VisitEnd
    from scrapy_ha.store.queue import RedisQueue

__all__ = ["end_revisit"]

logger = logging.getLogger(__name__)

#: Said once per process: a sharded crawl keeps no revisits.
_WARNED: set[str] = set()


async def end_revisit(
    queue: RedisQueue,
    spider: Spider | None,
    op: EndOp,
    stats: StatsCollector,
    compact: Callable[[bytes], bytes] = bytes,
) -> bool:
    """Send a finished revisited request back to the delayed set (fenced by its lease),
    stored as *compact* makes it (compacted with the crawl's dictionary: it waits there for
    its interval, a continuous crawl's every page); in a sharded crawl, which keeps no
    revisits (``HA_REVISIT`` is refused there), ack it. True when the visit counts as a
    page done, as the crawl's ``acked`` counts it (its lease was current, and it did not
    fail): the worker's pages per second and its prefetch count it as an ack."""
    visit = op.visit
    assert visit is not None
    if len(shards_of(queue)) > 1:
        if not _WARNED:
            _WARNED.add("sharded")
            logger.warning("%s is not revisited: HA_SHARDS > 1 keeps no revisit", op.request)
        pair = (op.entry_id, op.token)
        commits = {pair: op.commit} if op.commit is not None else {}
        result = await queue.sync(ack=[pair], commits=commits)
        stats.inc_value("ha/acked" if result.acked else "ha/stale_acks")
        return bool(result.acked)
    done = await revisit(
        queue,
        Revisit(
            op.entry_id,
            op.token,
            int(visit.interval * 1000),
            compact(encode_request(op.request, spider)),
            visit.fingerprint,
            visit.found,
            visit.saved,
            interval_bucket(visit.interval),
            _allocation(visit),
            seen=visit.seen,
            priority=op.request.priority,
        ),
        op.commit,
    )
    if done.multiplier and visit.allocation is not None:
        visit.allocation.multiplier = done.multiplier
    _count_commit(op, done, stats)
    if done.due == DOUBLE:
        stats.inc_value("ha/revisit/double")
        logger.info("%s is revisited by another entry of the crawl: this one ends", op.request)
    elif done.due == LEFT:
        stats.inc_value("ha/revisit/left")
    elif done.due and visit.found == "failed":
        stats.inc_value("ha/revisit/failed_visits")
        logger.info(
            "%s: its visit failed; it is revisited in %g s (dead-lettered after "
            "HA_REVISIT_MAX_FAILURES failed visits in a row)",
            op.request,
            visit.interval,
        )
    elif done.due:
        stats.inc_value("ha/revisit/scheduled")
        stats.inc_value(f"ha/revisit/{visit.found}")
    else:
        stats.inc_value("ha/stale_acks")
    return bool(done.due) and visit.found != "failed"


def _allocation(visit: VisitEnd) -> tuple[float, ...] | None:
    """What an adaptive revisit tells Redis of the crawl's budget (None: fixed revisits)."""
    if visit.allocation is None or visit.load is None:
        return None
    load, share = visit.load, visit.allocation
    return (
        *(load.load, load.base, share.budget, load.first_multiplier, load.held, load.held_base),
        *(share.lowest, share.highest),
    )


def _count_commit(op: EndOp, done: Revisited, stats: StatsCollector) -> None:
    """Count what the revisited page committed (its items, its checkpoint), as the acks of
    a round are counted; a stale end commits nothing."""
    if op.commit is None:
        return
    if done.items:
        stats.inc_value("ha/items/committed", done.items)
    if done.checkpoints:
        stats.inc_value("ha/checkpoint/saved", done.checkpoints)
    refused = len(op.commit.items) - done.items
    if refused > 0:
        stats.inc_value("ha/items/refused", refused)
        logger.warning(
            "%d item(s) not committed: the lease of their page had expired (another worker "
            "redoes the page and commits its own)",
            refused,
        )
