-- lib/revisit: a revisited request's rules, kept by revisit.lua.
--   revisits      sorted set: entry id -> due time (ms) of its next visit (what is due soon)
--   revisit_urls  hash: fingerprint -> the entry id that revisits it
--   revisit_alloc hash: load, base (visits a second), mu (the multiplier, seconds)
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

-- ALLOC_GAIN: how far the multiplier moves per cycle of revisits, in log terms, for a load
-- twice the budget (x 1.65): each revisit moves it by (load / budget) ^ (ALLOC_GAIN / n)
-- for n revisited URLs, so the whole crawl's revisits (one cycle, when the load reflects
-- the multiplier) move it about once: faster oscillates (the load answers a cycle late).
local ALLOC_GAIN = 0.5
-- ALLOC_STEP: the most one revisit moves it (10%), for a crawl of a few URLs.
local ALLOC_STEP = 0.1

-- revisit_allocate(alloc, revisits, d_load, d_base, budget, first)
--   KEYS: alloc (revisit_alloc), revisits (the caller's KEYS[i])
--   Rule (the budget): adaptive revisits spend what the crawl can fetch. The sums of
--   1 / interval over the revisited URLs (load) and of their configured intervals (base)
--   move by what this revisit changed (d_load, d_base); the multiplier (the marginal gain
--   of freshness a visit a second must buy; scrapy_ha/config/freshness.py) grows while the
--   load is over the budget (budget > 0, else base), so the next intervals are longer, and
--   shrinks while under it. It starts at first.
--   Returns the multiplier.
local function revisit_allocate(alloc, revisits, d_load, d_base, budget, first)
  local load = tonumber(redis.call('HINCRBYFLOAT', alloc, 'load', d_load))
  local base = tonumber(redis.call('HINCRBYFLOAT', alloc, 'base', d_base))
  local mu = tonumber(redis.call('HGET', alloc, 'mu')) or first
  local target = budget > 0 and budget or base
  if target > 0 and load > 0 then
    local n = math.max(redis.call('ZCARD', revisits), 1)
    local step = (load / target) ^ (ALLOC_GAIN / n)
    mu = mu * math.min(1 + ALLOC_STEP, math.max(1 - ALLOC_STEP, step))
  end
  redis.call('HSET', alloc, 'mu', string.format('%.17g', mu))
  return mu
end

-- revisit_withdraw(alloc, held, held_base)
--   KEYS: alloc (revisit_alloc)
--   Rule (a URL counts once in the budget): an entry that ends as a double (another entry
--   revisits its URL, and counted its own interval when it claimed it) takes what it held
--   out of the sums, its last interval's 1 / interval (held) and its configured one's
--   (held_base), both 0 if it was never scheduled.
local function revisit_withdraw(alloc, held, held_base)
  if held ~= 0 then redis.call('HINCRBYFLOAT', alloc, 'load', -held) end
  if held_base ~= 0 then redis.call('HINCRBYFLOAT', alloc, 'base', -held_base) end
end
