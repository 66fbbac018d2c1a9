"""A worker whose settings the crawl in Redis refused while it ran: it stops.

The scripts that enqueue refuse, before any write, a dupefilter of another kind than the
crawl's (``lua/lib/seen.lua``'s rule, one kind): a worker with ``HA_DUPEFILTER_TTL`` and one
without that started an empty crawl together both passed the check at start (one of them
of an earlier version, which claims no kind there: ``ha:{S}:filter``), and the one that
wrote second is refused (:class:`~scrapy_ha.store.bloom.DupefilterRefused`). No retry
can fix a setting, so the worker logs one ERROR that names its settings, what the crawl
keeps and the fix, and closes the spider as a worker that could not start does
(``ha_start_failed``, ``scrapy crawl`` exits with 1), instead of retrying for ever.

Nothing is lost. The refused call wrote nothing, and it carried the acks of the pages that
yielded the new requests it refused: those pages are not done in Redis. At close every
lease the worker holds, its finished pages' too, goes back to the queue, and another worker
redoes those pages and yields their links again; a lease it cannot give back expires and is
reclaimed. Its new requests waiting for Redis's verdict are turned back, as duplicates are,
so no callback runs for a request Redis never had.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy_ha.config.startup import START_FAILED, FailedExit
from scrapy_ha.scheduler import engine

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from scrapy_ha.scheduler.fresh import Handout
    from scrapy_ha.scheduler.outbox import Outbox, Pair
    from scrapy_ha.scheduler.session.ends import Ends
    from scrapy_ha.store.bloom import DupefilterRefused

__all__ = ["Refusal"]

logger = logging.getLogger(__name__)


class Refusal:
    """Whether Redis refused this worker's settings, and what the worker does then."""

    def __init__(self, crawler: Crawler, handout: Handout, outbox: Outbox) -> None:
        self.crawler = crawler
        self.handout = handout
        self.outbox = outbox
        self.error: DupefilterRefused | None = None
        self._exit: FailedExit | None = None

    def stop(self, exc: DupefilterRefused) -> bool:
        """Stop the crawl of this worker (once): one ERROR, its new requests waiting for a
        verdict turned back, the spider closed as ``ha_start_failed``. True (stopping)."""
        if self.error is None:
            self.error = exc
            logger.error("scrapy-ha stops this worker: %s", exc)
            children = self.outbox.children  # as a duplicate is: no callback, never acked
            handed = {e.fresh.lease[0] for e in children if e.fresh and e.fresh.lease}
            self.handout.settle(children, dropped=handed)
            self._exit = FailedExit(self.crawler)
            engine.close_spider(self.crawler, START_FAILED)
        return True

    def unfinished(self, ends: Ends) -> list[Pair]:
        """The leases a refused worker finished but cannot end (their acks and ends would
        go with calls Redis refuses), to give back with the rest at close; none when it was
        not refused. Its new requests are dropped: they never reached Redis, and the pages
        that yielded them are given back."""
        if self.error is None:
            return []
        outbox = self.outbox
        pairs = outbox.acks + [(op.entry_id, op.token) for op in outbox.ends]
        pairs += [(lease.id, lease.token) for lease, *_ in ends.corrupt]
        if outbox.children or pairs:
            logger.info(
                "%d new request(s) of this worker not stored; %d finished page(s) given back "
                "unacked, to be redone by a worker whose settings fit the crawl",
                len(outbox.children),
                len(pairs),
            )
        return pairs
