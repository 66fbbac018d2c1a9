"""Where a table's next page starts: at the entry it starts with, named by its score and
id, not by its rank. Entries taken out of the set below it meanwhile (due retries a worker
promoted, dead letters requeued, purged or dropped by retention) moved every rank: a rank
made the next page skip as many rows it never showed (268 of 1,848 delayed entries never
shown, paged while a worker promoted due retries). A rank alone (what a page gave before)
is still taken."""

from __future__ import annotations

import math
from typing import Any

from scrapy_ha.store.wire import text as text_of

#: Between a place's score and its id (hex: an id may hold the ``.`` that separates the
#: places of a sharded crawl's cursor).
SEP = "_"


def place(score: float, entry_id: str) -> str:
    """The cursor of a page that starts with entry *entry_id* of *score*."""
    whole = math.floor(score) if math.isfinite(score) else 0
    return f"{whole}{SEP}{entry_id.encode().hex()}"


#: One batch of a table, read at one instant: the window's size, then the members from
#: where the cursor points on (its entry's rank; once the entry has left the set, or came
#: back with another score, where its score would be: rows shown already may then be shown
#: again, never rows skipped), with their scores. Ranked and read in one call, so entries
#: leaving the set between two batches of one request move no batch past rows never read.
#: KEYS[1] the table's sorted set
#: ARGV[1] 'edge' (the window's first entry; its last newest first), 'rank' or 'place'
#: ARGV[2] the rank, or the place's id  ARGV[3] the place's whole score (ms)
#: ARGV[4] '1' newest first  ARGV[5] members to read (1 or more)
#: ARGV[6] since ('' or '(<ms>')  ARGV[7] until ('' or '<ms>')
WINDOW_LUA = """
local key, mode, newest, n = KEYS[1], ARGV[1], ARGV[4] == '1', tonumber(ARGV[5])
local first, last = 0, nil
if ARGV[6] ~= '' then first = redis.call('ZCOUNT', key, '-inf', ARGV[6]) end
if ARGV[7] == '' then last = redis.call('ZCARD', key) - 1
else last = redis.call('ZCOUNT', key, '-inf', ARGV[7]) - 1 end
local total = math.max(0, last - first + 1)
local pos
if mode == 'edge' then
  if newest then pos = last else pos = first end
elseif mode == 'rank' then
  pos = tonumber(ARGV[2])
else
  local floor = tonumber(ARGV[3])
  local score = tonumber(redis.call('ZSCORE', key, ARGV[2]) or '')
  if score and math.floor(score) == floor then
    pos = redis.call('ZRANK', key, ARGV[2])
  elseif newest then  -- the last entry not later than it
    pos = redis.call('ZCOUNT', key, '-inf', '(' .. ARGV[3] + 1) - 1
  else  -- the first not earlier
    pos = redis.call('ZCOUNT', key, '-inf', '(' .. ARGV[3])
  end
end
if pos < first or pos > last then return {total, {}} end
local lo, hi = pos, math.min(last, pos + n - 1)
if newest then lo, hi = math.max(first, pos - n + 1), pos end
return {total, redis.call('ZRANGE', key, lo, hi, 'WITHSCORES')}
"""


async def window(
    client: Any,
    key: str,
    cursor: int | str | None,
    n: int,
    newest_first: bool,
    since_ms: int | None = None,
    until_ms: int | None = None,
) -> tuple[int, list[tuple[str, float]]]:
    """How many entries of *key* the time window holds, and up to *n* of them (at least
    one) as (id, score) in reading order from *cursor* on (None: the window's edge). A
    ValueError for a cursor no page gave."""
    text = "" if cursor is None else str(cursor)
    mode, at, floor = "edge", "", 0
    if SEP in text:
        floor_text, _, hex_id = text.partition(SEP)
        mode, at, floor = "place", bytes.fromhex(hex_id).decode(), int(floor_text)
    elif cursor is not None:
        mode, at = "rank", str(int(text))
    args = [mode, at, floor, "1" if newest_first else "0", max(n, 1)]
    args += ["" if since_ms is None else f"({since_ms}", "" if until_ms is None else until_ms]
    total, flat = await client.register_script(WINDOW_LUA)(keys=[key], args=args)
    pairs = [(text_of(flat[i]), float(flat[i + 1])) for i in range(0, len(flat), 2)]
    if newest_first:
        pairs.reverse()
    return int(total), pairs
