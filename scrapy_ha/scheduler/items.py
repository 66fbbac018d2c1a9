"""The item outbox (``HA_ITEMS = "outbox"``): a page's items are committed with its ack.

The guarantee: **an item reaches the crawl's item stream once, from the run of its page
that was acked.** A worker keeps the items each of its unfinished pages yielded, once they
went through its item pipelines (Scrapy's ``item_scraped`` signal, sent before the scraper
lets go of the page), keyed by the page's lease. When the page is finished its items go
into the outbox with its ack (:class:`~scrapy_ha.store.wire.Commit`), and the script call
that acks the page adds them to the stream, fenced by the lease token (``lib/commit.lua``):
a page whose lease was lost (its worker frozen, killed or too slow) commits nothing, and
the worker that redoes it commits the items of its own run. A page that ends otherwise
than by an ack commits nothing either: a retried page yields its items again when it is
redone, and a dead-lettered one when ``scrapy-ha dlq requeue`` puts it back
(``ha/items/discarded``). Items that no page yielded (from ``start()``) have no lease to
ride with: they go to the stream as they come, from every worker whose ``start()`` yields
them (``ha/items/no_page``).

An item the codec cannot store fails its page, as a child request that cannot be stored
does: the page is dead-lettered (class ``unstorable``) when it finishes, never acked
without it. Whatever encoding the item raises counts (a ``CodecError``, and also a
``RecursionError`` for an item that contains itself or a ``ValueError`` for an int of more
than 4,300 digits), and so do a page's items past ``PAGE_ITEMS_MAX_BYTES`` together.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy import signals

from scrapy_ha import metakeys
from scrapy_ha.codec import CodecError
from scrapy_ha.codec.items import encode_item
from scrapy_ha.store.wire import Commit
from scrapy_ha.verdict import FailureClass, Verdict

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.crawler import Crawler

    from scrapy_ha.scheduler.outbox import CheckpointSave, Outbox, Pair

__all__ = ["PAGE_ITEMS_MAX_BYTES", "ItemHold"]

logger = logging.getLogger(__name__)

#: A page's items, encoded, at most (bytes). They go to Redis in the one call that acks the
#: page, which Redis runs whole while every other client waits (about 12 ms a megabyte: 30
#: items of 5 MB held it 2 s in a QA run), and a call past 1 GB is refused (Redis's
#: ``client-query-buffer-limit``): 210 such items were sent again and again, never acked,
#: the worker's memory at 8 to 10 GB. A page past it fails as ``unstorable``.
PAGE_ITEMS_MAX_BYTES = 64 * 1024 * 1024


def _shown(item: Any) -> str:
    """*item*'s repr for a log line, or its type where even that fails (an int of more than
    4,300 digits raises ValueError in repr)."""
    try:
        return repr(item)
    except Exception:  # noqa: BLE001 - a log line must not fail on the item it shows
        return f"<{type(item).__name__} that cannot be shown>"


class ItemHold:
    """The items of this worker's unfinished pages, held until each page's lease ends."""

    def __init__(
        self, crawler: Crawler, outbox: Outbox, page_of: Callable[[Pair], Request | None]
    ) -> None:
        assert crawler.stats is not None
        self.stats = crawler.stats
        self.outbox = outbox
        self._page_of = page_of  # the unfinished request of a lease (InFlight's)
        self._held: dict[Pair, list[bytes]] = {}
        self._sizes: dict[Pair, int] = {}  # the bytes of each page's items so far
        crawler.signals.connect(self._scraped, signal=signals.item_scraped)

    def __len__(self) -> int:
        return sum(map(len, self._held.values()))

    def _scraped(self, item: Any, response: Any = None, spider: Any = None, **kw: Any) -> None:
        """An item went through every pipeline: hold it with its page (*response* is the
        page's response, or the failure its errback handled)."""
        page = getattr(response, "request", None)
        lease = page.meta.get(metakeys.LEASE) if page is not None else None
        try:
            data = encode_item(item, spider)
        except Exception as exc:  # noqa: BLE001 - a cycle (RecursionError), an int over
            # 4,300 digits (ValueError) or any other failure of the codec is an item it
            # cannot store, as a CodecError is: raised here, Scrapy's signal would swallow
            # it and the page would be acked without the item
            self._unstorable(item, lease, exc)
            return
        if lease is None:
            self.outbox.loose_items.append(data)  # sent by the next round
            self.stats.inc_value("ha/items/no_page")
            return
        pair = (str(lease[0]), str(lease[1]))
        before = self._sizes.get(pair, 0)
        self._sizes[pair] = before + len(data)
        if before > PAGE_ITEMS_MAX_BYTES:  # the page failed already (said once)
            return
        if before + len(data) > PAGE_ITEMS_MAX_BYTES:
            self._held.pop(pair, None)
            why = (
                f"its page's items pass {PAGE_ITEMS_MAX_BYTES:,} bytes (PAGE_ITEMS_MAX_BYTES), "
                "more than one Redis call takes with the page's ack"
            )
            self._unstorable(item, lease, CodecError(why))
            return
        self._held.setdefault(pair, []).append(data)

    def _unstorable(self, item: Any, lease: Any, exc: Exception) -> None:
        page = self._page_of((str(lease[0]), str(lease[1]))) if lease else None
        why = str(exc) if isinstance(exc, CodecError) else f"{type(exc).__name__}: {exc}"
        self.stats.inc_value("ha/items/unstorable")
        logger.error(
            "Cannot store an item in the item stream (%s): %s; item %.200s",
            why,
            f"the page {page} that yielded it will be dead-lettered"
            if page is not None
            else "the item is dropped",
            _shown(item),
        )
        if page is not None and metakeys.OUTCOME not in page.meta:
            page.meta[metakeys.OUTCOME] = Verdict.dead(FailureClass.UNSTORABLE, f"item: {why}")

    def commit(self, pair: Pair, checkpoint: CheckpointSave | None) -> None:
        """The page of lease *pair* is acked: its items (and its task's checkpoint, which
        must not be saved before them) go with the ack."""
        items = self._held.pop(pair, None)
        self._sizes.pop(pair, None)
        if items is None and checkpoint is None:
            return
        save = (checkpoint.task, checkpoint.doc, checkpoint.ttl_ms) if checkpoint else None
        self.outbox.commits[pair] = Commit(tuple(items or ()), save)

    def discard(self, pair: Pair, verdict: Verdict, *, revisited: bool = False) -> None:
        """The page of lease *pair* ends otherwise than by an ack: its items do not count
        (a retry yields them again; a failed visit that goes back to its revisits
        (*revisited*), at its next visit; a dead letter, when it is requeued)."""
        items = self._held.pop(pair, None)
        self._sizes.pop(pair, None)
        if items:
            self.stats.inc_value("ha/items/discarded", len(items))
            logger.info(
                "%d item(s) of a page that ends as %s (%s) were not committed: %s",
                len(items),
                "a failed visit" if revisited else verdict.op,
                verdict.failure_class,
                _again(verdict, revisited=revisited),
            )

    def forget(self, pair: Pair) -> None:
        """The page of lease *pair* could not be ended: its lease expires, and whoever
        redoes the page yields its items again."""
        self._held.pop(pair, None)
        self._sizes.pop(pair, None)

    def clear(self) -> None:
        """Forget every page's items (at close: the pages are redone, and yield them again)."""
        self._held.clear()
        self._sizes.clear()


def _again(verdict: Verdict, *, revisited: bool) -> str:
    """When the items of a page not acked are yielded again."""
    if verdict.is_retry:
        return "it yields them again when it is retried"
    if revisited:
        return "it yields them again at its next visit (it goes back to its revisits)"
    return "`scrapy-ha dlq requeue` crawls it again"
