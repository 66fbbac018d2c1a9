"""Requests handed to the engine and not finished yet.

Scrapy has no "request finished" signal: a request is finished when the engine holds it
nowhere any more (:func:`scrapy_ha.scheduler.engine.busy_check`). Only then does its lease end: by
an ack, or, when a middleware recorded another outcome in its meta, by a retry or a dead
letter. Both go into the :class:`~scrapy_ha.scheduler.outbox.Outbox`, after the children the page
yielded (they were queued while it ran). With the item outbox (:mod:`.items`) an ack carries
the items its page yielded, and the end of a page that is not acked drops them. A revisited
request that is redirected finishes with its target, which is carried under its lease and
decides how it ends (:mod:`.carry`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy_ha import metakeys
from scrapy_ha.codec import drop_set_again
from scrapy_ha.config.items import DEFAULT_ITEMS, OUTBOX
from scrapy_ha.scheduler import engine
from scrapy_ha.scheduler.carry import Carried, outcome_of
from scrapy_ha.scheduler.items import ItemHold
from scrapy_ha.scheduler.outbox import CheckpointSave, EndOp
from scrapy_ha.scheduler.pages import close_left_page
from scrapy_ha.scheduler.revisits import Revisits
from scrapy_ha.verdict import FailureClass, Verdict

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from scrapy import Request
    from scrapy.crawler import Crawler

    from scrapy_ha.config.scheduler import SchedulerConfig
    from scrapy_ha.scheduler.outbox import Outbox, Pair, VisitEnd

logger = logging.getLogger(__name__)


def fence_of(request: Request) -> tuple[str, str] | None:
    """The lease that fences *request*: its page's (a child), or its original's (a
    redirect, which carries the original's lease and is no retry); None for a root."""
    meta = request.meta
    parent = meta.get(metakeys.PARENT)
    if parent is None:
        verdict = Verdict.from_meta(meta) if metakeys.OUTCOME in meta else None
        if verdict is None or not verdict.is_retry:
            parent = meta.get(metakeys.LEASE)
    return (str(parent[0]), str(parent[1])) if parent else None


def _redirect_of(request: Request, held: Request) -> bool:
    """Whether *request* is RedirectMiddleware's copy of *held*: one redirect more, from its
    URL (a child yielded with its page's meta copied names the page's own redirects)."""
    meta = request.meta
    urls = meta.get("redirect_urls") or [None]
    return (
        metakeys.PARENT not in meta
        and urls[-1] == held.url
        and meta.get("redirect_times") == held.meta.get("redirect_times", 0) + 1
    )


@dataclass(frozen=True)
class Kin:
    """What this worker's requests in flight say of a new request (:meth:`InFlight.kin`)."""

    #: the retry copy of a request in flight: not queued, the original's lease carries it
    retry: bool = False
    #: the unfinished page that yielded it (fails if it cannot be stored)
    parent: Request | None = None
    #: the lease that fences it in Redis (its page's, or its original's): None for a root
    fence: Pair | None = None
    #: it names, by copied meta, a page this worker already finished: queued as a root
    late: bool = False
    #: the redirect of a revisited request in flight: carried under its lease, in memory
    #: (:mod:`.carry`), never stored
    carried: bool = False


#: What a request that names no lease is to what is in flight: a root.
_ROOT = Kin()
#: The retry copy of a request in flight.
_RETRY = Kin(retry=True)
#: The redirect of a revisited request in flight.
_CARRIED = Kin(carried=True)


class InFlight:
    """The unfinished requests of this worker, by entry id: (lease token, request)."""

    def __init__(
        self,
        crawler: Crawler,
        outbox: Outbox,
        config: SchedulerConfig | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.crawler = crawler
        self.outbox = outbox
        self._held: dict[str, tuple[str, Request]] = {}
        self._retry_priority: dict[str, int] = {}  # entry id -> priority of its retry copy
        #: a request handed to the engine, its lease in Redis (reported early: poison)
        self.on_add: Callable[[Pair], None] | None = None
        #: a retry copy of a request in flight taken in its place (the download gate
        #: forgets what it held for that request's early download)
        self.on_retry: Callable[[Request], None] | None = None
        config_items = config.items if config is not None else DEFAULT_ITEMS
        #: the items of the pages in flight, with HA_ITEMS = "outbox" (None: off)
        self.items = ItemHold(crawler, outbox, self.request_of) if config_items == OUTBOX else None
        #: a finished request's revisit (None: acked; see scheduler/revisits.py), and what
        #: a redirect of a revisited one is (Revisits.redirected)
        self.revisit: Callable[[Request], VisitEnd | None] | None = None
        #: a revisited request whose visit failed: its revisit (None: dead-lettered)
        self._failed_visit: Callable[[Request], VisitEnd | None] | None = None
        self._redirected: Callable[[Request, Request], bool] | None = None
        #: the redirects of revisited requests in flight, carried under their lease
        self.carried = Carried()
        #: off in a sharded crawl (set once connected), which keeps no revisits
        self.carries = True
        #: whether a redirect may be carried (the shell's: its domain open and without
        #: crawl-wide limits, its scheme allowed); else it is stored, as any child
        self.may_carry: Callable[[Request], bool] = lambda request: True  # noqa: ARG005
        #: HA_REVISIT has rules: any request may be revisited, not only one whose meta
        #: asks it (``ha_revisit``), the one thing to look at per request without them
        self._revisit_rules = True
        if config is not None:
            # (*clock*: Redis's, so that every worker times a URL's visits by one clock)
            revisits = Revisits.from_config(crawler, config, clock)
            self.revisit, self._redirected = revisits.visit_end, revisits.redirected
            self._failed_visit = revisits.failed_visit
            self._revisit_rules = bool(config.revisit.rules)

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._held

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)

    def add(self, entry_id: str, token: str, request: Request, *, stored: bool = True) -> None:
        """*request* was handed to the engine; a lease not *stored* in Redis yet (a fresh
        request) needs no report: the round that stores it marks it handed."""
        self._held[entry_id] = (token, request)
        if self.carried.targets:  # the entry leased again: a target of its lost lease is moot
            self.carried.pop(entry_id)
        if stored and self.on_add is not None:
            self.on_add((entry_id, token))

    def discard(self, entry_id: str) -> None:
        """Forget a request whose lease never existed (see :meth:`Scheduler.settle`)."""
        self._held.pop(entry_id, None)
        self._retry_priority.pop(entry_id, None)  # a retry of it accepted before: moot
        self.carried.pop(entry_id)

    def drop_waiting(self, lost: set[Pair]) -> int:
        """Drop the carried targets not handed out yet of the requests in flight whose lease
        is *lost*: their originals end (refused by Redis), and are visited again."""
        gone = [pair[0] for pair in lost if self.request_of(pair) is not None]
        return sum(self.carried.waiting.pop(entry_id, None) is not None for entry_id in gone)

    def pairs(self) -> list[Pair]:
        return [(i, t) for i, (t, _) in self._held.items()]

    def clear(self) -> None:
        self._held.clear()
        self.carried.clear()
        if self.items is not None:
            self.items.clear()

    def request_of(self, pair: Pair) -> Request | None:
        """The unfinished request of lease *pair* (None: none, or another lease of it)."""
        held = self._held.get(pair[0])
        return held[1] if held is not None and held[0] == pair[1] else None

    def at_cap(
        self, config: SchedulerConfig, waiting: Callable[[], bool], wake: Callable[[], None]
    ) -> bool:
        """No request may go out now (:meth:`full`, :meth:`waits_for_acks`)."""
        held, box = len(self._held), self.outbox
        if held < config.max_inflight and held + len(box.acks) + len(box.ends) < config.max_unacked:
            return waiting() and self.full(config.max_inflight, waiting)  # below both caps
        if self.full(config.max_inflight, waiting):
            return True
        return self.waits_for_acks(config.max_unacked, wake)

    def full(self, limit: int, waiting: Callable[[], bool]) -> bool:
        """*limit* requests (``HA_MAX_INFLIGHT``) are unfinished, or *waiting()* (a suspect
        waits for the engine to empty), once the finished ones are collected."""
        if len(self._held) < limit and not waiting():
            return False
        self.collect_finished()
        return len(self._held) >= limit or waiting()

    def waits_for_acks(self, limit: int, wake: Callable[[], None]) -> bool:
        """The requests handed out whose lease Redis still holds (unfinished, or finished
        with their ack, retry or dead letter not sent yet) reach *limit* (``max_unacked``:
        ``HA_MAX_INFLIGHT + CONCURRENT_REQUESTS``): nothing more may go out. Requests finish
        and are replaced while a round is out, so without this what a killed worker leaves
        to redo would grow with the round's length. Then the outbox is held back, so that
        the round that acks them wakes the engine, and *wake* (the session) runs it."""
        box = self.outbox
        if len(self._held) + len(box.acks) + len(box.ends) < limit:
            return False
        box.held_back = True
        assert self.crawler.stats is not None
        self.crawler.stats.inc_value("ha/waited_for_acks")
        wake()
        return True

    def collect_finished(self) -> None:
        """Move requests the engine is done with to the outbox: acks, or ends. A request
        whose redirect is carried (:mod:`.carry`) is done once its target is done too."""
        if not self._held:
            return
        busy, carried = engine.busy_check(self.crawler), self.carried
        done = [i for i, (_, r) in self._held.items() if not busy(r)]
        if carried.targets:  # (most rounds: nothing carried, no call per request)
            done = [i for i in done if carried.finished(i, busy)]
        for entry_id in done:
            token, request = self._held.pop(entry_id)
            try:
                self._finished(entry_id, token, request)
            except Exception:  # a bug, or a value nobody checked: this request alone pays
                self._forget(entry_id, token)
                assert self.crawler.stats is not None
                self.crawler.stats.inc_value("ha/op_errors")
                logger.exception(
                    "scrapy-ha could not end %s: its lease is left to expire (it is "
                    "reclaimed and fetched again; dead-lettered as poison if it fails so "
                    "every time)",
                    request,
                )

    def _forget(self, entry_id: str, token: str) -> None:
        """A request whose end failed: what it left to go with its end goes too (its items
        are yielded again by whoever redoes its page)."""
        self.outbox.commits.pop((entry_id, token), None)
        self._retry_priority.pop(entry_id, None)
        self.carried.pop(entry_id)
        if self.items is not None:
            self.items.forget((entry_id, token))

    def _finished(self, entry_id: str, token: str, request: Request) -> None:
        if self.carried.targets and (target := self.carried.pop(entry_id)) is not None:
            outcome_of(request, target)  # its lease ends by its target's outcome
        items, meta = self.items, request.meta
        if metakeys.OUTCOME in meta and (verdict := Verdict.from_meta(meta)):
            self._judged(entry_id, token, request, verdict)
            return
        pair = (entry_id, token)
        if items is None:
            if metakeys.CHECKPOINT_SAVE in meta:
                self._checkpoint(entry_id, token, request)
        else:  # its checkpoint goes with its items, in the ack: never saved before them
            items.commit(pair, self._checkpoint(entry_id, token, request, ack=True))
        revisit = self.revisit
        # (a page revisited before is looked at without rules too: it leaves the revisits)
        looked = self._revisit_rules or metakeys.REVISIT in meta or metakeys.REVISIT_STATE in meta
        if revisit is None or not looked:
            self.outbox.acks.append(pair)
            return
        if (visit := revisit(request)) is not None:
            # its lease ends as a revisit, which commits what the ack would have
            commit = self.outbox.commits.pop(pair, None)
            self.end(EndOp("revisit", *pair, request, visit.interval, visit=visit, commit=commit))
            return
        self.outbox.acks.append(pair)

    def _judged(self, entry_id: str, token: str, request: Request, verdict: Verdict) -> None:
        """End a request a middleware judged: a retry, or a dead letter; a revisited URL's
        failed visit goes back to its revisits instead (:meth:`Revisits.failed_visit`)."""
        if verdict.failure_class == FailureClass.GATE:  # no attempt: waits for its gate
            if self.items is not None:  # (stored as it is now: it waited once, meta says)
                self.items.discard((entry_id, token), verdict, revisited=False)
            self.end(EndOp("retry", entry_id, token, request))
            return
        if not verdict.is_retry:  # a dead-lettered page holds its chain back no more
            self._checkpoint(entry_id, token, request)
        visit = None if verdict.is_retry else self._failed(request)
        if self.items is not None:
            self.items.discard((entry_id, token), verdict, revisited=visit is not None)
        if visit is not None:
            self.end(EndOp("revisit", entry_id, token, request, visit.interval, visit=visit))
            return
        self.end(EndOp(verdict.op, entry_id, token, request))

    def _failed(self, request: Request) -> VisitEnd | None:
        if self._failed_visit is None:
            return None
        if not (self._revisit_rules or metakeys.REVISIT in request.meta):
            return None
        return self._failed_visit(request)

    def _checkpoint(
        self, entry_id: str, token: str, request: Request, *, ack: bool = False
    ) -> CheckpointSave | None:
        """The checkpoint a page saves as it ends (before its lease ends: it is fenced),
        queued; or, with *ack*, returned to go with the page's ack."""
        if metakeys.CHECKPOINT_SAVE not in request.meta:
            return None
        save = CheckpointSave(entry_id, token, *request.meta.pop(metakeys.CHECKPOINT_SAVE))
        if not ack:
            self.outbox.checkpoints.append(save)
        return save

    def save_checkpoint(
        self, page: Request, task: str, doc: bytes, ttl_ms: int, *, at_finish: bool
    ) -> bool:
        """Save *task*'s checkpoint under *page*'s lease (a carried target's: its
        original's): queued now (True: to send), or kept in its meta until the page ends."""
        lease = page.meta.get(metakeys.LEASE)
        if lease is None:
            return False
        if at_finish:
            page.meta[metakeys.CHECKPOINT_SAVE] = (task, doc, ttl_ms)
            return False
        self.outbox.checkpoints.append(CheckpointSave(lease[0], lease[1], task, doc, ttl_ms))
        return True

    def end(self, op: EndOp) -> None:
        """A lease to end otherwise than by an ack; a retry goes with its copy's priority.
        The request goes back to Redis without the headers the next download sets again."""
        if op.kind != "defer":
            drop_set_again(op.request)
            close_left_page(op.request)
        priority = self._retry_priority.pop(op.entry_id, None)
        if op.kind == "retry" and priority is not None:
            op = EndOp(op.kind, op.entry_id, op.token, op.request, op.delay, priority)
        self.outbox.ends.append(op)

    def kin(self, request: Request) -> Kin:
        """A new request's relation to what is in flight here: the retry copy of an
        unfinished request (recorded: the original's lease moves to the delayed set when it
        finishes, with the copy's priority, RETRY_PRIORITY_ADJUST applied), or the page
        that yielded it and the lease that fences it."""
        meta = request.meta
        if metakeys.PARENT not in meta and metakeys.LEASE not in meta:
            return _ROOT  # most requests of a crawl without the add-on: nothing to look up
        if self._is_retry_of_one(request):
            if self.on_retry is not None:
                self.on_retry(request)
            return _RETRY
        fence = fence_of(request)
        late = fence is not None and fence[0] not in self._held
        if fence is not None and not late and self._carries(fence[0], request):
            return _CARRIED
        # a child yielded with its page's meta copied: told on its own, not as a target,
        # and at its own priority (not its page's before a retry lowered it)
        meta.pop(metakeys.REVISIT_TARGET, None)
        meta.pop(metakeys.RETRY_BASE_PRIORITY, None)
        return Kin(parent=self._parent_of(request), fence=None if late else fence, late=late)

    def _carries(self, entry_id: str, request: Request) -> bool:
        """Whether *request*, a redirect of the request in flight *entry_id* (or of its
        carried target: a chain), is carried under its lease (:mod:`.carry`): when that
        request is revisited (:meth:`Revisits.redirected`), in a crawl that keeps revisits."""
        if self._redirected is None:
            return False
        held = self._held[entry_id][1]
        target = self.carried.target_of(entry_id)
        # a redirect of the target copies what was stripped of it (Revisits.redirected),
        # which still counts a redirect for good later in the chain
        chained = target is not None and _redirect_of(request, target)
        hop = chained or _redirect_of(request, held)
        revisited = hop and self._redirected(held, request)
        if not (chained or (revisited and self.carries)) or not self.may_carry(request):
            return False
        self.carried.carry(entry_id, request)
        return True

    def _is_retry_of_one(self, request: Request) -> bool:
        if metakeys.OUTCOME not in request.meta:  # most requests: no verdict to read
            return False
        verdict = Verdict.from_meta(request.meta)
        lease = request.meta.get(metakeys.LEASE)
        if verdict is None or not verdict.is_retry or not lease:
            return False
        held = self._held.get(lease[0])
        if held is None or held[1] is request:
            return False
        self._retry_priority[lease[0]] = request.priority
        return True

    def _parent_of(self, request: Request) -> Request | None:
        """The unfinished page that yielded *request* (ParentLeaseMiddleware tags it)."""
        lease = request.meta.get(metakeys.PARENT)
        if not lease:
            return None
        held = self._held.get(lease[0])
        if held is None or held[0] != lease[1]:
            return None
        return held[1]
