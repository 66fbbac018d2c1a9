"""Where a table's next page starts: at the entry it starts with, named by its score and
id, not by its rank. Entries taken out of the set below it meanwhile (due retries a worker
promoted, dead letters requeued, purged or dropped by retention) moved every rank: a rank
made the next page skip as many rows it never showed (268 of 1,848 delayed entries never
shown, paged while a worker promoted due retries). A rank alone (what a page gave before)
is still taken."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from scrapy_ha.store.wire import text as text_of

#: Between a place's score and its id (hex: an id may hold the ``.`` that separates the
#: places of a sharded crawl's cursor).
SEP = "_"


class Entry(NamedTuple):
    """A member of a table as a batch reads it: its id as text, its score, its bytes."""

    id: str
    score: float
    member: bytes


def place(score: float, member: bytes | str) -> str:
    """The cursor of a page that starts with *member* (as Redis holds it: an id not UTF-8
    shows escaped, and that text names no member) of *score* (an infinite one written by
    hand is named so: as 0 it sent the next page back to the first, or past every entry)."""
    whole = str(math.floor(score)) if math.isfinite(score) else ("inf" if score > 0 else "-inf")
    raw = member if isinstance(member, bytes) else member.encode()
    return f"{whole}{SEP}{raw.hex()}"


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
#: ARGV[8] the place's gone entry's first not earlier, ARGV[9] last not later: ZCOUNT's
#: bounds, written here (Lua writes a number of 15 digits or more rounded to 14)
#: ARGV[10] 'ids': the members alone, then the last one's score (an action on all of
#: 120,000 dead letters read their scores in 3.5 times the time of their ids)
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
    pos = redis.call('ZCOUNT', key, '-inf', ARGV[9]) - 1
  else  -- the first not earlier
    pos = redis.call('ZCOUNT', key, '-inf', ARGV[8])
  end
end
if pos < first or pos > last then return {total, {}} end
local lo, hi = pos, math.min(last, pos + n - 1)
if newest then lo, hi = math.max(first, pos - n + 1), pos end
if ARGV[10] == 'ids' then  -- the members alone, and the last one's score
  local found = redis.call('ZRANGE', key, lo, hi)
  return {total, found, redis.call('ZSCORE', key, found[#found])}
end
return {total, redis.call('ZRANGE', key, lo, hi, 'WITHSCORES')}
"""


async def window_flat(
    client: Any,
    key: str,
    cursor: int | str | None,
    n: int,
    newest_first: bool,
    since_ms: int | None = None,
    until_ms: int | None = None,
    ids_only: bool = False,
) -> tuple[int, list[Any]]:
    """:func:`window`'s batch as Redis answers it, oldest first: member, score, member,
    score...; with *ids_only* the members, then the last one's score (building an
    :class:`Entry` each, or reading every score, took most of the time of an action on all
    of 120,000 dead letters)."""
    text = "" if cursor is None else str(cursor)
    mode, at, floor, bounds = "edge", b"", "0", ["", ""]
    if SEP in text:
        floor, _, hex_id = text.partition(SEP)
        mode, at = "place", bytes.fromhex(hex_id)
        if floor in ("inf", "-inf"):
            bounds = [f"({floor}", "+inf" if floor == "inf" else "-inf"]
        else:
            floor = str(int(floor))
            bounds = [f"({floor}", f"({int(floor) + 1}"]
    elif cursor is not None:
        mode, at = "rank", str(int(text)).encode()
    args = [mode, at, floor, "1" if newest_first else "0", max(n, 1)]
    args += ["" if since_ms is None else f"({since_ms}", "" if until_ms is None else until_ms]
    args += [*bounds, "ids" if ids_only else ""]
    reply = await client.register_script(WINDOW_LUA)(keys=[key], args=args)
    return int(reply[0]), [*reply[1], reply[2]] if ids_only and reply[1] else reply[1]


async def window(
    client: Any,
    key: str,
    cursor: int | str | None,
    n: int,
    newest_first: bool,
    since_ms: int | None = None,
    until_ms: int | None = None,
) -> tuple[int, list[Entry]]:
    """How many entries of *key* the time window holds, and up to *n* of them (at least
    one) in reading order from *cursor* on (None: the window's edge). A
    ValueError for a cursor no page gave."""
    total, flat = await window_flat(client, key, cursor, n, newest_first, since_ms, until_ms)
    entries = [Entry(text_of(m), float(s), m) for m, s in zip(flat[::2], flat[1::2], strict=True)]
    if newest_first:
        entries.reverse()
    return total, entries
