"""Reading a sorted set a batch at a time while others take entries out of it.

A listing that reads a batch by rank, then the next from the rank after it, skips as many
entries as left the set before that rank meanwhile (workers promote the soonest delayed
entries; a dead-letter queue at its cap drops its oldest), and may read one again; so does
one that finds the rank after its last entry first, as entries leave between that call
and the read (a dead-letter queue at its cap: 60 to 80 of 20,000 skipped). The next batch
is read by score instead, after the last entry read (:func:`rows_after`), at no offset, in
one round trip; :func:`by_score` walks a set so (the dead-letter listings, ``report``,
``delayed list``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

__all__ = ["by_score", "rows_after"]


async def by_score(
    client: Any,
    key: str,
    low: Any = "-inf",
    high: Any = "+inf",
    batch: int = 500,
    first: list[tuple[Any, float]] | None = None,
) -> AsyncIterator[list[tuple[Any, float]]]:
    """The entries (member, score) of the sorted set *key* scored from *low* to *high*, a
    batch at a time, oldest first: the first read by score (or *first*, read otherwise: a
    jump to a rank), each next by :func:`rows_after` the last one read. Entries past *high*
    in *first* are left out."""
    rows = first
    if rows is None:
        rows = await client.zrangebyscore(key, low, high, start=0, num=batch, withscores=True)
    while rows := [row for row in rows if high == "+inf" or row[1] <= float(high)]:
        yield rows
        rows = await rows_after(client, key, rows[-1], high, batch)


async def rows_after(
    client: Any, key: str, last: tuple[Any, float], until: Any = "+inf", batch: int = 500
) -> list[tuple[Any, float]]:
    """The next entries (member, score) of the sorted set *key* after *last*, scored up to
    *until*: those scored as it and named after it (Redis orders equal scores by member),
    then up to *batch* scored after it. Read by score, never at an offset or a rank: the
    entries that leave or come before it meanwhile change nothing."""
    member, score = last
    pipe = client.pipeline(transaction=False)  # (one round trip; a cluster: one slot)
    pipe.zrangebyscore(key, score, score, withscores=True)
    pipe.zrangebyscore(key, f"({score!r}", until, start=0, num=batch, withscores=True)
    tied, later = await pipe.execute()
    return [row for row in tied if _bytes(row[0]) > _bytes(member)] + list(later)


def _bytes(member: Any) -> bytes:
    return member if isinstance(member, bytes) else str(member).encode()
