"""Pagination checkpoints: a paginated task resumes from its last page, fenced by its lease.

Turn on with ``HA_CHECKPOINTS = True`` (the add-on adds the middleware). Every start request
is the root of a task (``meta["ha_task"]`` names it; else its fingerprint does;
``meta["ha_task"] = False`` opts it out), and so is any request the spider yields with
``meta["ha_task"] = "<name>"``. The middleware follows the task along its pagination chain,
the requests a page yields for the same callback as its own (or marked
``meta["ha_next_page"] = True``), and records in Redis, under the page's lease:

- when a page is finished (its items through the pipelines, its requests queued): the
  next page to fetch, the items processed, the last item id and the spider's fields;
- every ``HA_CHECKPOINT_ITEMS`` items within a page: how many of its items are done.

When the task starts again (its start request comes up in a new run, after the queue was
flushed or lost, or in an incremental re-crawl), it continues from the checkpointed page,
and a page processed again skips the items it already emitted (for pages whose output is
deterministic). A finished task is skipped unless ``HA_CHECKPOINT_RERUN`` is set or the
start request has ``meta["ha_rerun"] = True``.

The spider reads and adds its own fields through ``response.meta["ha_checkpoint"]``::

    def parse(self, response):
        fields = response.meta.get("ha_checkpoint", {})
        fields["last_seen"] = response.css("time::text").get()
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy import Request, signals
from scrapy.exceptions import NotConfigured

from scrapy_ha import metakeys
from scrapy_ha.codec import decode_request, encode_request
from scrapy_ha.config.middlewares import CheckpointConfig
from scrapy_ha.config.startup import configured, scrapy_command
from scrapy_ha.middlewares import storable
from scrapy_ha.middlewares.registry import CrawlScheduler, scheduler_for
from scrapy_ha.middlewares.storable import checkpoint_payload, page_fields, spider_fields
from scrapy_ha.middlewares.tasks import (
    Counter,
    Progress,
    branch,
    carried,
    is_mid_page_of,
    is_new_root,
    item_id,
    resume_state,
    same_method,
    task_id,
    without_progress,
)
from scrapy_ha.store.state import CheckpointStore

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from typing import Self

    from scrapy.crawler import Crawler
    from scrapy.http import Response

__all__ = ["CheckpointMiddleware"]

logger = logging.getLogger(__name__)
#: Items tracked between their page and the pipelines' verdict, at most: far above what
#: Scrapy keeps in flight (CONCURRENT_ITEMS per page × CONCURRENT_REQUESTS pages). An item
#: pushed out only holds its page's mid-page checkpoint back, never moves it forward.
PENDING_LIMIT = 100_000
#: In a task's progress (meta ``ha_cp``): its page is the one its checkpoint resumed it at.
RESUMED = "resumed"
#: What a checkpoint that cannot be read costs its task (and that task alone).
RESTART = "starting it from its root request"


class CheckpointMiddleware:
    """Spider middleware that saves and resumes pagination checkpoints."""

    def __init__(self, crawler: Crawler, config: CheckpointConfig | None = None) -> None:
        """*config* defaults to the crawler's settings (read whether HA_CHECKPOINTS is on)."""
        config = config or CheckpointConfig.from_settings(crawler.settings)
        self.crawler = crawler
        self.stats = crawler.stats
        self.config = config
        self.every = config.every_items
        self.max_bytes = config.max_bytes
        self.ttl_ms = config.ttl_ms
        self.rerun = config.rerun
        self.id_field = config.id_field
        # id(item) -> (its page's progress, its index in the page)
        self._pending: dict[int, tuple[Progress, int]] = {}
        self._branched: set[str] = set()  # tasks warned of as branching
        crawler.signals.connect(self._item_done, signal=signals.item_scraped)
        crawler.signals.connect(self._item_done, signal=signals.item_dropped)
        crawler.signals.connect(self._item_failed, signal=signals.item_error)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = configured(crawler, CheckpointConfig.from_settings)
        # off unless asked for (silent); and for scrapy fetch/parse/check's own request
        if not config.enabled or scrapy_command(crawler) is not None:
            raise NotConfigured
        return cls(crawler, config)

    # -- resume -------------------------------------------------------------------

    async def process_start(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for item_or_request in start:
            if isinstance(item_or_request, Request) and item_or_request.meta.get(
                metakeys.TASK, True
            ):
                item_or_request = await self._resume(item_or_request)
                if item_or_request is None:
                    continue
            yield item_or_request

    async def _resume(self, root: Request) -> Request | None:
        task = task_id(root, self.crawler)
        doc = await self._read(task)
        root.meta[metakeys.TASK] = task
        root.meta.setdefault(metakeys.TASK_STATE, {"page": 1, "items": 0})
        if doc is None:
            return root
        if doc.get("done") and not (self.rerun or root.meta.get(metakeys.RERUN)):
            self.stats.inc_value("ha/checkpoint/finished_skipped")
            logger.info(
                "Task %s is done (its checkpoint says so): skipped "
                "(HA_CHECKPOINT_RERUN to run it again)",
                task,
            )
            return None
        earlier = doc.get("run") != self._scheduler().admission.run  # (None: a version before)
        if doc.get("done") or not doc.get("next"):
            if doc.get("done") and earlier:
                root.meta[metakeys.TASK_STATE][metakeys.TASK_RERUN] = True  # see TASK_RERUN
            elif type(doc.get("page")) not in (int, float):  # (lib/checkpoint.lua's rule)
                return self._unreadable(task, "no page number", root)
            return root
        try:  # a rerun if saved by one, or by a version that recorded neither (resume_state)
            request = self._resumed(task, doc, rerun="run" not in doc, earlier=earlier)
            # filtered as its root is: by the run's start deduplication (a dont_filter
            # root), or as the root itself (a root filtered as any request, its URL kept)
            request.meta[metakeys.START_OF] = (
                self._fingerprint(root),
                None if root.dont_filter else root.url,
            )
            # and by the root's age (none: the crawl's TTL), not the page's own
            request.meta.pop(metakeys.RECRAWL_AFTER, None)
            if metakeys.RECRAWL_AFTER in root.meta:
                request.meta[metakeys.RECRAWL_AFTER] = root.meta[metakeys.RECRAWL_AFTER]
        except Exception as exc:
            return self._unreadable(task, exc, root)
        # said when the page is crawled (_follow): the scheduler may still filter it, the
        # task's chain in the queue already (another worker seeded the run)
        request.meta[metakeys.TASK_STATE][RESUMED] = True
        return request

    def _unreadable(self, task: str, why: object, root: Request) -> Request:
        """Garbage in one checkpoint costs its task's progress alone: from its *root*."""
        self.stats.inc_value("ha/checkpoint/unreadable")
        logger.warning("Checkpoint of task %s is unreadable (%s): %s", task, why, RESTART)
        return root

    def _fingerprint(self, root: Request) -> bytes:
        """The root's fingerprint: the scheduler seeds the resumed request by it, so a run seeds
        the task once (a worker that joins the run, or restarts into it, finds it seeded)."""
        assert self.crawler.request_fingerprinter is not None
        return bytes(self.crawler.request_fingerprinter.fingerprint(root))

    async def _read(self, task: str) -> dict[str, Any] | None:
        """The task's checkpoint; None (with a warning) where it cannot be read."""
        try:
            return await self._load(task)
        except NotConfigured:
            raise
        except Exception as exc:  # Redis, or garbage: the root goes on, its task from the queue
            logger.warning("Could not read the checkpoint of task %s (%s): %s", task, exc, RESTART)
            return None

    def _resumed(self, task: str, doc: dict[str, Any], **rerun: bool) -> Request:
        """The request a checkpoint resumes its task with: its next page, with its progress
        (any exception: a checkpoint of another shape, a scheme HA_ALLOWED_SCHEMES refuses)."""
        state = resume_state(doc, **rerun)
        request = decode_request(doc["next"], self.crawler.spider, schemes=self.config.schemes)
        fields = storable.resumed_fields(task, doc)
        request.meta[metakeys.TASK] = task
        request.meta[metakeys.TASK_STATE] = state
        request.meta[metakeys.CHECKPOINT] = fields
        # its own fingerprint is in the dupefilter from the last run; the run's start
        # deduplication takes its root's instead (see _fingerprint)
        request.dont_filter = True
        return request

    async def _load(self, task: str) -> dict[str, Any] | None:
        queue = self._scheduler().queue  # read each time: a reconnect makes a new client
        assert queue is not None
        return await CheckpointStore(queue.client, queue.keys).get(task)

    def _scheduler(self) -> CrawlScheduler:
        scheduler = scheduler_for(self.crawler)
        if scheduler is None or scheduler.queue is None:
            raise NotConfigured("HA_CHECKPOINTS needs SCHEDULER = 'scrapy_ha.Scheduler'")
        return scheduler

    # -- follow a page's output -----------------------------------------------------

    async def process_spider_output(
        self, response: Response, result: AsyncIterator[Any], spider: Any = None
    ) -> AsyncIterator[Any]:
        page = response.request
        task = page.meta.get(metakeys.TASK) if page is not None else None
        if page is None or not task:
            async for x in result:
                if is_new_root(x):
                    x = await self._resume(x)
                if x is not None:
                    yield x
            return
        async for x in self._follow(page, task, result):
            yield x

    async def _follow(
        self, page: Request, task: str, result: AsyncIterator[Any]
    ) -> AsyncIterator[Any]:
        """A task page's output: items counted (and skipped when done before), next pages
        held until the callback ends, then sent with the task's progress."""
        state = await self._page_state(page, task)
        if state.pop(RESUMED, False):  # said once, not again by the page's retry
            del page.meta[metakeys.TASK_STATE][RESUMED]
            self.stats.inc_value("ha/checkpoint/resumed")
            page_no, items = state.get("page", 1), state.get("items", 0)
            logger.info("Resumed task %s at page %s (%s items done)", task, page_no, items)
        spider_fields(page.meta, task, self.stats)  # a dict, for the callback to find
        skip, next_pages = int(state.pop("skip", 0)), []
        counter = Counter(page, state, skip, self._tracks(page))
        try:
            async for x in result:
                if is_new_root(x):
                    x = await self._resume(x)
                elif isinstance(x, Request) and self._is_next_page(x, page):
                    next_pages.append(x)
                    continue
                elif not isinstance(x, Request) and not self._count(x, counter, state):
                    continue
                if x is not None:
                    yield x
        except Exception:
            # the callback failed after yielding its next page: Scrapy would have crawled
            # it, so it still goes out (the page itself is retried as a parse error); the
            # page's checkpoint is saved only if it ends dead-lettered, not retried
            fields = page_fields(page.meta, task, self.stats)  # the callback's, as it left them
            self._branches(task, state, next_pages)
            for request in self._chain(next_pages, task, state, fields):
                yield request
            if next_pages:
                self._page_done(page, task, state, fields, next_pages[0])
            raise
        fields = page_fields(page.meta, task, self.stats)
        self._branches(task, state, next_pages)
        for request in self._chain(next_pages, task, state, fields):
            yield request
        self._page_done(page, task, state, fields, next_pages[0] if next_pages else None)

    def _branches(self, task: str, state: dict[str, Any], next_pages: list[Request]) -> None:
        """A page that yields several next pages branches its task: one checkpoint cannot
        say where each branch is, so the task's stays at this page (a restart from it
        crawls every branch again) and is never marked done by the first branch to end."""
        if len(next_pages) > 1 and not state.get("branched"):
            branch(state)  # (a rerun guessed ends here)
            if task not in self._branched:
                self._branched.add(task)
                self.stats.inc_value("ha/checkpoint/branched")
                logger.warning(
                    "Task %s branches (a page yielded %d next pages): its checkpoint stays "
                    "at that page and is not moved by the branches",
                    task,
                    len(next_pages),
                )

    def _tracks(self, page: Request) -> bool:
        return bool(self.every and metakeys.LEASE in page.meta)

    def _count(self, item: Any, counter: Counter, state: dict[str, Any]) -> bool:
        """Count an item of the page; False if it was emitted before (skip it)."""
        counter.index += 1
        if counter.index <= counter.skip:
            self.stats.inc_value("ha/checkpoint/items_skipped")
            return False
        if counter.progress is not None:
            self._track(item, counter.progress, counter.index)
        state["items"] = state.get("items", 0) + 1
        state["last_id"] = item_id(item, self.id_field, state.get("last_id"))
        return True

    def _chain(
        self, next_pages: list[Request], task: str, state: dict[str, Any], fields: dict[str, Any]
    ) -> list[Request]:
        for request in next_pages:
            request.meta[metakeys.TASK] = task
            request.meta[metakeys.TASK_STATE] = {**state, "page": state.get("page", 1) + 1}
            request.meta[metakeys.CHECKPOINT] = dict(fields)
        return next_pages

    async def _page_state(self, page: Request, task: str) -> dict[str, Any]:
        """The page's progress; for a page run again (its lease was reclaimed, or it was
        retried) the items its mid-page checkpoint says are done are skipped."""
        state = dict(page.meta.get(metakeys.TASK_STATE) or {"page": 1, "items": 0})
        if not (self.every and metakeys.LEASE in page.meta):
            return state
        try:
            doc = await self._load(task)
        except Exception as exc:  # a checkpoint is an optimisation: never fail the page
            logger.warning("Could not read the checkpoint of task %s: %s", task, exc)
            return state
        if is_mid_page_of(doc, page, state):
            assert doc is not None
            state["skip"], state["items"] = int(doc["skip"]), int(doc.get("items", 0))
        return state

    def _is_next_page(self, request: Request, page: Request) -> bool:
        marked = request.meta.get(metakeys.NEXT_PAGE)
        if marked is not None:
            return bool(marked)
        default = getattr(self.crawler.spider, "parse", None)  # what a None callback means
        return same_method(request.callback or default, page.callback or default)

    def _page_done(
        self,
        page: Request,
        task: str,
        state: dict[str, Any],
        fields: dict[str, Any],
        nxt: Request | None,
    ) -> None:
        if state.get("branched"):
            return  # see _branches
        doc: dict[str, Any] = {
            "task": task,
            "of": state.get("page", 1),  # the page it is about: see checkpoint.lua
            "page": state.get("page", 1) + (1 if nxt else 0),
            "items": state.get("items", 0),
            "fields": fields,
            "done": nxt is None,
        }
        doc.update(carried(state))
        if nxt is not None:
            doc["next"] = encode_request(without_progress(nxt), self.crawler.spider).decode()
        self._save_at_finish(page, task, doc)

    # -- saving -----------------------------------------------------------------------

    def _save_at_finish(self, page: Request, task: str, doc: dict[str, Any]) -> None:
        payload = self._checked(task, doc)
        if payload is not None:
            self._scheduler().save_checkpoint(page, task, payload, self.ttl_ms, at_finish=True)

    def _checked(self, task: str, doc: dict[str, Any]) -> bytes | None:
        doc["run"] = self._scheduler().admission.run  # (a task done in a run before: rerun)
        return checkpoint_payload(task, doc, max_bytes=self.max_bytes, stats=self.stats)

    def _track(self, item: Any, progress: Progress, index: int) -> None:
        if len(self._pending) >= PENDING_LIMIT:
            del self._pending[next(iter(self._pending))]  # the oldest
        self._pending[id(item)] = (progress, index)

    def _item_done(self, item: Any, response: Any = None, **kwargs: Any) -> None:
        tracked = self._pending.pop(id(item), None)
        if tracked is None:
            return
        progress, index = tracked
        if progress.add(index) - progress.saved >= self.every:
            self._save_mid_page(progress)
            progress.saved = progress.prefix

    def _item_failed(self, item: Any, response: Any = None, **kwargs: Any) -> None:
        """A failed item is never counted: no checkpoint moves past it (the page is
        crawled again, see the ``pipeline`` failure class)."""
        self._pending.pop(id(item), None)

    def _save_mid_page(self, progress: Progress) -> None:
        """Redo this page later, skipping the items already through the pipelines."""
        page, done = progress.page, progress.prefix
        task = page.meta[metakeys.TASK]
        if (page.meta.get(metakeys.TASK_STATE) or {}).get("branched"):
            return  # a page after its task branched: see _branches
        doc = {
            "task": task,
            "of": progress.page_no,
            "page": progress.page_no,
            "skip": done,
            "items": progress.items_before + done,
            "fields": spider_fields(page.meta, task, self.stats),
            "done": False,
            "next": encode_request(without_progress(page), self.crawler.spider).decode(),
        }
        doc.update(carried(page.meta.get(metakeys.TASK_STATE) or {}, metakeys.TASK_RERUN))
        payload = self._checked(task, doc)
        if payload is not None:
            self._scheduler().save_checkpoint(page, task, payload, self.ttl_ms, at_finish=False)
