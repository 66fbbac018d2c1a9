"""What a checkpoint can hold: JSON that Redis's cjson reads back (the scripts decode every
checkpoint they save). Python's json encodes more (a lone surrogate, any depth): such a
field of the spider's is dropped, such a checkpoint skipped, each with a warning, and the
task goes on without it."""

from __future__ import annotations

import json
import logging
import math
import sys
import weakref
from typing import TYPE_CHECKING, Any

from scrapy_ha import metakeys

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

__all__ = [
    "MAX_DEPTH",
    "checkpoint_payload",
    "drop_unstorable",
    "page_fields",
    "resumed_fields",
    "spider_fields",
    "storable_problem",
]

logger = logging.getLogger(__name__)

#: The deepest nesting of a checkpoint Redis reads: lua-cjson's ``decode_max_depth``
#: (1000 in Redis), the document itself at depth 1.
MAX_DEPTH = 1000
_SCALARS = (int, float, bool, type(None))


def storable_problem(value: Any, depth: int = 1) -> str | None:
    """Why *value* (at nesting *depth* of its checkpoint) cannot be stored as JSON that
    Redis's cjson reads back, None if it can: a type json.dumps cannot encode, NaN or
    infinity, a string that is not valid Unicode (a lone surrogate, half an emoji cut by an
    API), or deeper than :data:`MAX_DEPTH` (Python encodes them; the script refuses them)."""
    stack = [(value, depth)]
    while stack:
        x, level = stack.pop()
        if isinstance(x, str):
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                return f"a string that is not valid Unicode: {x!r}"
        elif isinstance(x, float) and not math.isfinite(x):
            return f"the number {x!r}"
        elif isinstance(x, (dict, list, tuple)):
            if level > MAX_DEPTH:
                return f"nested deeper than {MAX_DEPTH}"
            pairs = x.items() if isinstance(x, dict) else enumerate(x)
            for k, v in pairs:
                if isinstance(x, dict) and not isinstance(k, (str, *_SCALARS)):
                    return f"a key of type {type(k).__name__}"
                stack += [(k, level + 1), (v, level + 1)]
        elif not isinstance(x, _SCALARS):
            return f"a {type(x).__name__}, not JSON"
    return None


def _encoded(value: Any) -> bytes:
    """*value* as JSON Redis's cjson reads back, in C (no walk in Python): UTF-8, no NaN or
    infinity; raises on a type JSON cannot encode, a lone surrogate (UnicodeEncodeError),
    or a depth past Python's recursion limit."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.encode("utf-8")


def _problem(value: Any) -> str | None:
    """Why *value* cannot be stored, None if it can (the walk of :func:`storable_problem`
    only where Python may encode deeper than cjson reads: a recursion limit raised)."""
    try:
        _encoded(value)
    except (TypeError, ValueError, RecursionError) as exc:
        return f"{type(exc).__name__}: {exc}"[:200]
    return storable_problem(value) if sys.getrecursionlimit() > MAX_DEPTH else None


def unstorable_fields(fields: Any) -> list[tuple[str, str]]:
    """Drop from *fields* (the spider's, ``meta["ha_checkpoint"]``) those a checkpoint
    cannot store; returns each dropped name with why. Each is tried at the depth it has in
    the checkpoint (doc > fields > field), and only when the fields as a whole fail: one C
    encoding a page when they are fine."""
    if not isinstance(fields, dict) or _problem({"fields": fields}) is None:
        return []
    dropped = []
    for name in list(fields):
        problem = _problem({"fields": {name: fields[name]}})
        if problem is not None:
            del fields[name]
            dropped.append((str(name), problem))
    return dropped


#: What each crawl (by its stats) warned of already, once per task and cause: a spider
#: that writes the same field every page was warned at every page (a QA run); the stats
#: count every time.
_SAID: weakref.WeakKeyDictionary[Any, set[tuple[str, str]]] = weakref.WeakKeyDictionary()
#: Causes remembered at most per crawl (a broad crawl of many tasks): past it, said again.
SAID_LIMIT = 10_000
#: The most bytes of a checkpoint's next page's request (which HA_CHECKPOINT_MAX_BYTES does
#: not count): a form's state of a few hundred KB fits; Redis decodes the checkpoint at
#: each save, about 12 ms for 1 MB, every other call waiting meanwhile.
NEXT_MAX_BYTES = 1 << 20


def _warn_once(stats: Any, task: str, cause: str, message: str, *args: Any) -> None:
    said = _SAID.setdefault(stats, set())
    if (task, cause) in said:
        return
    if len(said) >= SAID_LIMIT:
        said.clear()
    said.add((task, cause))
    logger.warning(message + " (said once per task; counted in the stats)", *args)


def drop_unstorable(task: str, fields: Any, stats: StatsCollector) -> None:
    """Drop the spider's *fields* a checkpoint cannot store, with a warning: the page's
    checkpoint and the next pages' go on without them."""
    for name, problem in unstorable_fields(fields):
        stats.inc_value("ha/checkpoint/fields_dropped")
        _warn_once(
            stats,
            task,
            f"field {name}",
            "Field %r of the checkpoint of task %s cannot be stored (%s): dropped",
            name,
            task,
            problem,
        )


def spider_fields(meta: dict[str, Any], task: str, stats: StatsCollector) -> dict[str, Any]:
    """A page's fields as they are now: ``meta["ha_checkpoint"]``, the dict the page came with
    or one its callback put there in its place; a value that is no dict is replaced by an
    empty one, with a warning (once per task)."""
    fields = meta.get(metakeys.CHECKPOINT)
    if isinstance(fields, dict):
        return fields
    if fields is not None:
        stats.inc_value("ha/checkpoint/fields_dropped")
        kind = type(fields).__name__
        said = "meta['ha_checkpoint'] of task %s is a %s, not a dict: dropped"
        _warn_once(stats, task, "not a dict", said, task, kind)
    fields = meta[metakeys.CHECKPOINT] = {}
    return fields


def page_fields(meta: dict[str, Any], task: str, stats: StatsCollector) -> dict[str, Any]:
    """The fields a page's callback left (:func:`spider_fields`), without those a checkpoint
    cannot store (:func:`drop_unstorable`)."""
    fields = spider_fields(meta, task, stats)
    drop_unstorable(task, fields, stats)
    return fields


def checkpoint_payload(
    task: str, doc: dict[str, Any], *, max_bytes: int, stats: StatsCollector
) -> bytes | None:
    """The checkpoint's JSON, strict (what Redis's cjson reads back), None if it cannot be
    saved: too large even without the spider's fields, or not storable (counted, with a
    warning; the task goes on). Its size is measured without its next page's request
    (``"next"``), which the queue stores whatever its size (a long cursor URL, twice with
    its Referer, or a form's state). Encoded once, in C, before anything is walked: a large
    checkpoint costs what ``json.dumps`` costs (a walk in Python cost 35 times that)."""
    try:
        payload: bytes | None = _encoded(doc)
        problem = storable_problem(doc) if sys.getrecursionlimit() > MAX_DEPTH else None
    except (TypeError, ValueError, RecursionError):
        drop_unstorable(task, doc.get("fields"), stats)  # the next pages go on without them
        problem = _problem(doc)
        payload = _encoded(doc) if problem is None else None
    if payload is None or problem is not None:
        stats.inc_value("ha/checkpoint/unencodable")
        logger.warning("Checkpoint of task %s cannot be stored (%s): not saved", task, problem)
        return None
    size = len(payload)
    if size > max_bytes and "next" in doc:
        size = len(_encoded({k: v for k, v in doc.items() if k != "next"}))
    if len(payload) - size > NEXT_MAX_BYTES:  # (Redis decodes it at every save: ~12 ms a MB)
        next_limit = f"{NEXT_MAX_BYTES} (a checkpoint's next page's request)"
        _too_large(stats, task, "its next page's request", len(payload) - size, next_limit)
        return None
    if size > max_bytes:
        slim = (
            _encoded({**doc, "fields": {}, "fields_dropped": True}) if doc.get("fields") else None
        )
        if slim is not None and len(slim) - (len(payload) - size) <= max_bytes:
            # the task's progress without the spider's fields, as a field that cannot be
            # stored is dropped: a page's checkpoint not saved leaves a gap in its chain,
            # every later page's kept aside behind it, its end too, and every later run
            # crawled the task again from the gap (committing those pages' items again)
            stats.inc_value("ha/checkpoint/fields_dropped")
            _warn_once(
                stats,
                task,
                "too large, fields dropped",
                "Checkpoint of task %s is %d bytes (its next page not counted), over "
                "HA_CHECKPOINT_MAX_BYTES=%d: saved without the spider's fields (keep custom "
                "fields small)",
                task,
                size,
                max_bytes,
            )
            return slim
        limit = f"HA_CHECKPOINT_MAX_BYTES={max_bytes}"
        _too_large(stats, task, "it (its next page not counted)", size, limit)
        return None
    return payload


def _too_large(stats: StatsCollector, task: str, what: str, size: int, limit: str) -> None:
    """Count and say (once per task) a checkpoint not saved for its size: its task is not
    done (every later page's checkpoint waits behind it), and a later run resumes it from
    its last checkpoint saved."""
    stats.inc_value("ha/checkpoint/too_large")
    _warn_once(
        stats,
        task,
        "too large",
        "Checkpoint of task %s not saved: %s is %d bytes, over %s; the task resumes from its "
        "last checkpoint saved in a later run",
        task,
        what,
        size,
        limit,
    )


def resumed_fields(task: str, doc: dict[str, Any]) -> dict[str, Any]:
    """The spider's fields a checkpoint resumes its task with (raises on a shape that is no
    object); a checkpoint saved without them (over ``HA_CHECKPOINT_MAX_BYTES``) is said,
    the resumed page finding ``meta["ha_checkpoint"]`` empty."""
    fields = doc.get("fields", {})
    if not isinstance(fields, dict):
        raise ValueError(f'"fields" must be an object: {fields!r}')
    if doc.get("fields_dropped"):
        logger.warning(
            "Task %s resumes from a checkpoint saved without the spider's fields (over "
            "HA_CHECKPOINT_MAX_BYTES): meta['ha_checkpoint'] is empty",
            task,
        )
    return fields
