-- lib/revisit: a revisited request's rules, kept by revisit.lua.
--   revisits      sorted set: entry id -> due time (ms) of its next visit (what is due soon)
--   revisit_urls  hash: fingerprint -> the entry id that revisits it
--- @include "number"
--- @include "priority"

-- DAY_MS: a revisit a day past its due time is no longer counted as due (its entry was
-- dead-lettered, or left the queue): it leaves the revisits set.
local DAY_MS = 86400000

-- revisit_claim(urls, leased, delayed, id, fp)
--   KEYS: urls (revisit_urls), leased, delayed (the caller's KEYS[i])
--   Rule (one revisit per URL): a URL is revisited by one entry. The entry id that last
--   revisited fingerprint fp is kept; another entry that finishes a visit of fp while that
--   one is alive (leased, or waiting in the delayed set) is a double: it ends as an ack
--   instead of a revisit. An entry found neither leased nor delayed (pending, or gone:
--   dead-lettered, acked) gives way: if it was pending, it finds this one alive when it
--   finishes and ends then, so a URL is never revisited twice for more than one round,
--   and never left without its revisit.
--   Returns true when entry id revisits fp (recorded), false when it is a double.
local function revisit_claim(urls, leased, delayed, id, fp)
  if fp == '' then return true end
  local other = redis.call('HGET', urls, fp)
  if other and other ~= id and (redis.call('ZSCORE', leased, other)
      or redis.call('ZSCORE', delayed, other)) then
    return false
  end
  if other ~= id then redis.call('HSET', urls, fp, id) end
  return true
end

-- revisit_due(revisits, id, due, now)
--   KEYS: revisits (the caller's KEYS[i])
--   Records entry id's next visit at due; forgets those a day past theirs.
local function revisit_due(revisits, id, due, now)
  redis.call('ZADD', revisits, int_str(due), id)
  redis.call('ZREMRANGEBYSCORE', revisits, '-inf', '(' .. int_str(now - DAY_MS))
end

-- revisit_score(score, due)
--   Returns the pending score a revisit due at due (ms) is promoted with, from its lease's
--   score: its priority, and in the start queue's part of that priority (after every other
--   request of the priority, as start requests), ordered by due time (second): when more
--   revisits are due than the crawl can fetch, the longest overdue goes first, whatever the
--   crawl's order (a LIFO order would starve the oldest entries).
local function revisit_score(score, due)
  local base = score - score % PRIORITY_STEP
  return base + START_PART + math.floor(due / 1000)
end
