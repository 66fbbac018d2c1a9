"""What a consumer says when Redis took its group or its stream away while it ran.

``scrapy-ha items --undeclare`` takes a group away (``NOGROUP`` at the consumer's next
read); ``scrapy-ha flush`` deletes the stream with every group (a consumer blocked on it is
woken with ``UNBLOCKED the stream key no longer exists``, one that was not gets
``NOGROUP``); a Redis restarted from a snapshot older than the group (RDB alone) lacks
both. Either way the consumer stops (exit 1 from ``scrapy-ha items``) and does not
make the group or the stream again: an operator took them away, and a stream made anew
behind a flush would undo it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy_ha.store.connection import REDIS_DOWN_ERRORS

if TYPE_CHECKING:
    import redis.exceptions

    from scrapy_ha.store.items import ItemStream

__all__ = ["GroupGone", "StreamGone", "gone", "refused_read", "woken"]


class GroupGone(Exception):
    """The consumer's group was taken away while it ran (``items --undeclare``, a flush,
    a Redis that lost it): it stops, and does not make the group again."""


class StreamGone(GroupGone):
    """The crawl's item stream was deleted while the consumer ran (``scrapy-ha flush``)."""


async def gone(
    exc: redis.exceptions.ResponseError, streams: list[ItemStream], group: str
) -> GroupGone | None:
    """What *exc*, raised by a read of *streams*, means: the stream deleted, the group
    taken away, or neither (None: an error of another kind)."""
    said = str(exc)
    if "UNBLOCKED" not in said and "NOGROUP" not in said:  # (inside a script's on Redis 6)
        return None
    spider = streams[0].keys.spider
    if not all([await s.client.exists(s.key) for s in streams]):
        return StreamGone(
            f"the item stream of {spider} was deleted while this consumer ran (a "
            "`scrapy-ha flush`, or Redis restarted from an older snapshot that lacks it: RDB "
            "alone, see docs/scaling.md): it stopped, and the entries it had not "
            "acknowledged went with the stream; start it again (with --create before the "
            "crawl's first worker) to consume the crawl anew, or what the crawl commits since"
        )
    if "NOGROUP" not in said:  # UNBLOCKED, the streams there: see woken()
        return None
    return GroupGone(
        f"group {group} of {spider} was taken away while this consumer ran (`scrapy-ha "
        "items --undeclare`, a `flush`, or a Redis that lost it: restarted from an older "
        "snapshot, a failover): it stopped; start it again to make the group anew"
    )


def woken(exc: redis.exceptions.ResponseError) -> bool:
    """*exc* woke a blocked read whose streams are still there (:func:`gone` said None): a
    primary demoted by a failover (``UNBLOCKED force unblock from blocking operation,
    instance state changed``) or ``CLIENT UNBLOCK ... ERROR``. Nothing was read: the
    consumer reads again, as after Redis was away (before, it stopped for good, saying
    its stream was deleted)."""
    return "UNBLOCKED" in str(exc)


async def refused_read(
    exc: redis.exceptions.ResponseError, streams: list[ItemStream], group: str
) -> Exception:
    """A read of *streams* refused with *exc*: raises :class:`GroupGone` (or
    :class:`StreamGone`) where the group or the stream is gone, *exc* again where it is no
    wake-up (:func:`woken`); else returns the error to wait on as for a Redis away (*exc*,
    or the error met asking whether the streams are there: not fatal either)."""
    try:
        why = await gone(exc, streams, group)
    except REDIS_DOWN_ERRORS as down:
        return down
    if why is not None:
        raise why from None
    if not woken(exc):
        raise exc
    return exc
