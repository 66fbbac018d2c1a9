"""Where a table's next page starts: at the entry it starts with, named by its score and
id, not by its rank. Entries taken out of the set below it meanwhile (due retries a worker
promoted, dead letters requeued, purged or dropped by retention) moved every rank: a rank
made the next page skip as many rows it never showed (268 of 1,848 delayed entries never
shown, paged while a worker promoted due retries). A rank alone (what a page gave before)
is still taken."""

from __future__ import annotations

import math
from typing import Any

#: Between a place's score and its id (hex: an id may hold the ``.`` that separates the
#: places of a sharded crawl's cursor).
SEP = "_"


def place(score: float, entry_id: str) -> str:
    """The cursor of a page that starts with entry *entry_id* of *score*."""
    whole = math.floor(score) if math.isfinite(score) else 0
    return f"{whole}{SEP}{entry_id.encode().hex()}"


async def start_rank(client: Any, key: str, cursor: int | str, newest_first: bool) -> int:
    """The rank in *key* a page of *cursor* starts at: its entry's, or, once the entry
    left the set (or came back with another score), where its score would be (rows shown
    already may then be shown again, never rows skipped). A ValueError for a cursor no
    page gave."""
    text = str(cursor)
    if SEP not in text:
        return int(text)  # a rank
    floor_text, _, hex_id = text.partition(SEP)
    floor, entry_id = int(floor_text), bytes.fromhex(hex_id).decode()
    score = await client.zscore(key, entry_id)
    if score is not None and math.isfinite(score) and math.floor(score) == floor:
        return int(await client.zrank(key, entry_id))
    if newest_first:  # the last entry not later than it
        return int(await client.zcount(key, "-inf", f"({floor + 1}")) - 1
    return int(await client.zcount(key, "-inf", f"({floor}"))  # the first not earlier
