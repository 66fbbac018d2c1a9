"""A paginated task's state as the checkpoint middleware reads it: which requests start a
task, how far a page's items went through the pipelines (:class:`Progress`), and whether a
stored checkpoint is a mid-page one of the page at hand."""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from scrapy import Request

from scrapy_ha import metakeys
from scrapy_ha.middlewares.storable import storable_problem

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

__all__ = [
    "Counter",
    "Progress",
    "branch",
    "is_mid_page_of",
    "is_new_root",
    "item_id",
    "resume_state",
    "same_method",
    "task_id",
    "without_progress",
]


def is_new_root(x: Any) -> bool:
    """A request the spider marked as the root of a task (``meta["ha_task"] = "name"``)."""
    return (
        isinstance(x, Request)
        and bool(x.meta.get(metakeys.TASK))
        and (metakeys.TASK_STATE not in x.meta)
    )


def without_progress(page: Request) -> Request:
    drop = (
        metakeys.TASK_STATE,
        metakeys.CHECKPOINT,
        metakeys.TASK,
        metakeys.START_OF,
    )  # stored beside it in the checkpoint
    meta = {k: v for k, v in page.meta.items() if k not in drop}
    return page.replace(meta=meta)


class Counter:
    """Where a page's output is: items seen, items to skip, what the pipelines finished."""

    __slots__ = ("index", "progress", "skip")

    def __init__(self, page: Request, state: dict[str, Any], skip: int, tracked: bool) -> None:
        self.index = 0
        self.skip = skip
        self.progress = Progress(page, state, skip) if tracked else None


class Progress:
    """Which items of one page are through the pipelines: the unbroken run from the first
    (``prefix``) plus those done out of order. Each index is added and removed once, so a
    page of n items costs O(n) in all."""

    __slots__ = ("ahead", "items_before", "page", "page_no", "prefix", "saved")

    def __init__(self, page: Request, state: dict[str, Any] | None = None, skip: int = 0) -> None:
        state = state or {}
        self.page = page
        self.page_no = state.get("page", 1)
        self.items_before = int(state.get("items", 0)) - skip  # the task's, before this page
        self.prefix = skip  # items 1..prefix are done (those skipped were done before)
        self.saved = skip  # the prefix last checkpointed
        self.ahead: set[int] = set()

    def add(self, index: int) -> int:
        """Mark item *index* (1-based) done; returns the new prefix."""
        self.ahead.add(index)
        while self.prefix + 1 in self.ahead:
            self.prefix += 1
            self.ahead.discard(self.prefix)
        return self.prefix


def is_mid_page_of(doc: dict[str, Any] | None, page: Request, state: dict[str, Any]) -> bool:
    """True if *doc* is a mid-page checkpoint of this very page, further than *state*
    (False for a document of another shape: garbage is never this page's progress)."""
    if not doc or doc.get("done") or "skip" not in doc or not doc.get("next"):
        return False
    try:
        resume_state(doc)
        if doc.get("page") != state.get("page", 1) or doc["skip"] <= int(state.get("skip", 0)):
            return False
        return bool(json.loads(doc["next"]).get("u") == page.url)
    except (ValueError, TypeError, AttributeError):
        return False


def branch(state: dict[str, Any]) -> None:
    """Mark the task of *state* branched (carried by every page after this one); a rerun
    only guessed (:data:`~scrapy_ha.metakeys.RERUN_GUESSED`) ends there."""
    state["branched"] = True
    if state.get(metakeys.TASK_RERUN) == metakeys.RERUN_GUESSED:
        del state[metakeys.TASK_RERUN]


def carried(state: dict[str, Any], *names: str) -> dict[str, Any]:
    """What a checkpoint keeps of a page's progress beside its page and items: the last item
    id, and whether its task is a rerun (*names*: those alone)."""
    return {k: state[k] for k in names or ("last_id", metakeys.TASK_RERUN) if k in state}


def resume_state(doc: dict[str, Any], rerun: bool = False, earlier: bool = False) -> dict[str, Any]:
    """The progress a checkpoint resumes its task with (page, items, last_id, skip), its
    shape checked: ValueError for a document a bug or a hand wrote otherwise. *rerun*: the
    checkpoint was saved by a version that recorded no run (nor whether its task was a
    rerun): it goes on as a rerun, guessed (:func:`branch`; a QA run of an upgrade: a chain
    the version before left at page 2 was crawled a page per run). One saved since says so
    itself: a task not rerun resumed from an earlier run's (its chain branched, never done)
    is filtered as any, or every later run crawled its whole chain again (a review).
    *earlier*: it was saved in a run before this one: a rerun it says goes on guessed too
    (a rerun whose chain branched left its checkpoint, never done, before the branch,
    marked a rerun's: every later run crawled every branch again; a review)."""
    state: dict[str, Any] = {k: doc[k] for k in ("page", "items", "last_id", "skip") if k in doc}
    said = doc.get(metakeys.TASK_RERUN)
    if said is True or said == metakeys.RERUN_GUESSED or rerun:
        state[metakeys.TASK_RERUN] = (
            True if said is True and not earlier else metakeys.RERUN_GUESSED
        )
    for name, least in (("page", 1), ("items", 0), ("skip", 0)):
        value = state.get(name, least)
        if type(value) is not int or value < least:
            raise ValueError(f'"{name}" must be a whole number of {least} or more: {value!r}')
    if not isinstance(doc.get("next"), str):
        raise ValueError(f'"next" must be a stored request (text): {doc.get("next")!r}')
    return state


def same_method(a: Any, b: Any) -> bool:
    return getattr(a, "__func__", a) is getattr(b, "__func__", b)


def item_id(item: Any, field: str, default: Any) -> Any:
    """The item's id field, where a checkpoint can store it (else *default*, the last)."""
    try:
        value = item[field]
    except (KeyError, TypeError, IndexError):
        return default
    if not isinstance(value, (str, int, float)) or storable_problem(value):
        return default
    return value


def task_id(root: Request, crawler: Crawler) -> str:
    """The task a root request starts: ``meta["ha_task"]``, else its fingerprint (16 hex)."""
    given = root.meta.get(metakeys.TASK)
    if given:
        return str(given)
    assert crawler.request_fingerprinter is not None
    return hashlib.sha1(crawler.request_fingerprinter.fingerprint(root)).hexdigest()[:16]  # noqa: S324
