"""A crawl the operator's tools cannot read, and why: one key of another type than scrapy-ha
writes (``SET ha:{S}:stats x`` by hand, or another program under the same prefix).

Such a key costs its crawl alone: the exporter leaves that crawl's series out and sets its
``scrapy_ha_crawl_read_error`` to 1, the dashboard's overview lists it apart with the
reason, and a command on it says ``error: <key> holds a <type>`` and exits with code 2,
while every other crawl reads as before. Workers set such a key aside themselves
(``<key>:corrupt:<seconds>``, :meth:`~scrapy_ha.store.queue.RedisQueue.set_aside_wrong_types`).
"""

from __future__ import annotations

__all__ = [
    "UNREADABLE",
    "CrawlUnreadable",
    "check_types",
    "explain",
    "explain_sync",
    "read_layout_keys",
    "raise_first",
    "unforeseen",
]

import logging
from typing import TYPE_CHECKING, Any

import redis.exceptions

from scrapy_ha.keys import Keys
from scrapy_ha.store.sharding import layout_keys, layout_problem
from scrapy_ha.store.wire import text as _text

if TYPE_CHECKING:
    from collections.abc import Iterable

logger = logging.getLogger(__name__)


class CrawlUnreadable(Exception):
    """The keys of crawl *spider* cannot be read; *reason* says which key and what it holds
    (``ha:{S}:stats holds a string (...)``) when one has the wrong type."""

    def __init__(self, spider: str, reason: str) -> None:
        super().__init__(reason)
        self.spider = spider
        self.reason = reason


#: What reading one crawl may raise when a key of it is not what scrapy-ha wrote: Redis's
#: WRONGTYPE (or a script's error), a reply that does not parse, or a reader's own
#: CrawlUnreadable. A connection error is not one of them: it concerns every crawl (the
#: exporter's ``scrapy_ha_redis_up 0``).
UNREADABLE: tuple[type[Exception], ...] = (
    CrawlUnreadable,
    redis.exceptions.ResponseError,
    ValueError,
    TypeError,
)


def read_layout_keys(prefix: str, spider: str, stored: Any) -> Keys:
    """The crawl's keys for its stored layout (*stored*: its shard count as read, None when
    absent), as :func:`~scrapy_ha.store.sharding.layout_keys` has them; a CrawlUnreadable
    that names the key when the layout is none scrapy-ha writes (read as one shard, the
    crawl would look empty, and be left out of every listing without a word)."""
    if stored is not None and (problem := layout_problem(stored)):
        key = Keys(prefix, spider).shard_count
        raise CrawlUnreadable(spider, f"{key} {problem}: set it to the crawl's HA_SHARDS")
    return layout_keys(prefix, spider, stored)


#: The (crawl, error type) pairs whose unforeseen error this process logged: each once, not
#: at every scrape. Forgotten past MAX_LOGGED (then logged again), so the set stays small.
_LOGGED: set[tuple[str, str]] = set()
MAX_LOGGED = 1024


def unforeseen(spider: str, error: Exception) -> str:
    """Why crawl *spider* could not be read when reading it raised an error no reader
    foresaw: a bug in scrapy-ha rather than in the crawl's state, so it is logged at ERROR
    with its traceback, the first time per crawl and error type. The caller leaves that
    crawl alone out (its read-error gauge 1), and lets Redis being down (it concerns every
    crawl) through."""
    seen = (spider, f"{type(error).__module__}.{type(error).__qualname__}")
    if seen not in _LOGGED:
        if len(_LOGGED) >= MAX_LOGGED:
            _LOGGED.clear()
        _LOGGED.add(seen)
        logger.error(
            "unexpected error reading the crawl %s: a bug in scrapy-ha, not in the crawl's "
            "state (please report it with this traceback; logged once per crawl and type)",
            spider,
            exc_info=error,
        )
    return (
        f"cannot read the crawl {spider}: unexpected {type(error).__name__}: {error} "
        "(a bug in scrapy-ha, its traceback logged at ERROR)"
    )


def raise_first(replies: Iterable[Any]) -> None:
    """Raise the first error among the replies of a pipeline run with
    ``raise_on_error=False`` (nothing when there is none)."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply


def _expected(keys: Iterable[Keys]) -> dict[str, str]:
    """The type each key of the crawl must have, shard by shard."""
    types: dict[str, str] = {}
    for k in keys:
        types |= k.types()
        types[k.shard_count] = "string"
        types[k.filter_kind] = "string"
        types[k.finish_record] = "string"
        types[k.joins] = "zset"
        types[k.dictionaries] = "hash"
    return types


def _wrong(expected: dict[str, str], found: list[Any]) -> str | None:
    """The first key of another type than scrapy-ha keeps there, named; None if none."""
    for (key, want), got in zip(expected.items(), found, strict=True):
        kind = _text(got)
        if kind not in ("none", want):
            return f"{key} holds a {kind} (scrapy-ha keeps a {want} there): rename or delete it"
    return None


def _reason(spider: str, error: BaseException, expected: dict[str, str], found: list[Any]) -> str:
    return _wrong(expected, found) or f"cannot read the crawl {spider}: {error}"


def _layout(replies: list[Any]) -> Any:
    """The crawl's stored layout from a pipeline's (TYPE, GET) of its shard count."""
    kind, stored = replies
    return stored if _text(kind) == "string" and not isinstance(stored, Exception) else None


# An explanation takes two round trips: the crawl's layout (its shard count), then the TYPE
# of each of its keys. The pipelines are built here once; each client runs them its way.


def _layout_pipe(client: Any, prefix: str, spider: str) -> Any:
    """A pipeline of the TYPE and GET of the crawl's shard count (not run)."""
    pipe = client.pipeline(transaction=False)
    base = Keys(prefix, spider)
    pipe.type(base.shard_count)
    pipe.get(base.shard_count)
    return pipe


def _types_pipe(
    client: Any, prefix: str, spider: str, replies: list[Any]
) -> tuple[dict[str, str], Any]:
    """The type each key of the crawl must have (shard by shard, as the *replies* of
    :func:`_layout_pipe` say), and a pipeline of the TYPE of each (not run)."""
    shards = layout_keys(prefix, spider, _layout(replies)).every_shard()
    expected = _expected([Keys(prefix, spider), *shards])
    pipe = client.pipeline(transaction=False)
    for key in expected:
        pipe.type(key)
    return expected, pipe


def explain_sync(client: Any, prefix: str, spider: str, error: BaseException) -> CrawlUnreadable:
    """Why crawl *spider* could not be read (*error* raised reading it): the first of its
    keys of a wrong type, found with a blocking client (two round trips)."""
    if isinstance(error, CrawlUnreadable):
        return error
    layout = _layout_pipe(client, prefix, spider).execute(raise_on_error=False)
    expected, types = _types_pipe(client, prefix, spider, layout)
    return CrawlUnreadable(spider, _reason(spider, error, expected, types.execute()))


async def explain(client: Any, prefix: str, spider: str, error: BaseException) -> CrawlUnreadable:
    """:func:`explain_sync` with a ``redis.asyncio`` client."""
    if isinstance(error, CrawlUnreadable):
        return error
    layout = await _layout_pipe(client, prefix, spider).execute(raise_on_error=False)
    expected, types = _types_pipe(client, prefix, spider, layout)
    return CrawlUnreadable(spider, _reason(spider, error, expected, await types.execute()))


async def check_types(client: Any, prefix: str, spider: str) -> None:
    """Raise :class:`CrawlUnreadable` naming the first key of crawl *spider* (of any shard)
    of another type than scrapy-ha writes (two round trips, ``redis.asyncio``): called
    before an action that writes, so that a refusal means nothing was done (an action that
    met such a key in its third shard had already changed the first two)."""
    layout = await _layout_pipe(client, prefix, spider).execute(raise_on_error=False)
    expected, types = _types_pipe(client, prefix, spider, layout)
    wrong = _wrong(expected, await types.execute())
    if wrong is not None:
        raise CrawlUnreadable(spider, wrong)
