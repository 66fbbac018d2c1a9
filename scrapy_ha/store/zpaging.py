"""Reading a sorted set a batch at a time while others take entries out of it.

A listing that reads a batch by rank, then the next from the rank after it, skips as many
entries as left the set before that rank meanwhile (workers promote the soonest delayed
entries; a dead-letter queue at its cap drops its oldest), and may read one again. The
next batch starts instead where the last entry read is now (:func:`rank_after`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["rank_after"]


async def rank_after(client: Any, key: str, last: tuple[Any, float], batch: int = 500) -> int:
    """The rank now of the entry after *last* (member, score) in the sorted set *key*:
    past *last* itself, or, if it left the set too, past the entries scored before it or
    scored as it and named before it (Redis orders equal scores by member)."""
    member, score = last
    rank = await client.zrank(key, member)
    if rank is not None:
        return int(rank) + 1
    start = int(await client.zcount(key, "-inf", f"({score!r}"))
    member = _bytes(member)
    while True:  # the entries scored as it: those named before it were read
        rows = await client.zrange(key, start, start + batch - 1, withscores=True)
        before = 0
        for name, scored in rows:
            if scored != score or _bytes(name) > member:
                return start + before
            before += 1
        start += before
        if len(rows) < batch:
            return start


def _bytes(member: Any) -> bytes:
    return member if isinstance(member, bytes) else str(member).encode()
