-- lib/revisit: a revisited request's rules, kept by revisit.lua.
--   revisits      sorted set: entry id -> due time (ms) of its next visit (what is due soon)
--   revisit_urls  hash: fingerprint -> the entry id that revisits it
--   revisit_alloc hash: load, base (visits a second), mu (the multiplier, seconds); e:<id>
--                 -> "<load> <base>": what an adaptive revisit entry holds in them
-- Rule (the budget never stops a script): its numbers are read as text and written whole
-- (HSET), never with HINCRBYFLOAT, which fails on a field that holds garbage after the
-- script already wrote (a lease ended, its domain's slot freed: left half done). A sum that
-- holds garbage (not a finite number: written by hand, or by a bug) is made again from what
-- the entries hold, counted as revisit_repaired; a multiplier that does starts again.
--- @include "number"
--- @include "priority"
--- @include "stats"

-- DAY_MS: a revisit a day past its due time is no longer counted as due (its entry was
-- dead-lettered, or left the queue): it leaves the revisits set, unless it waits in the
-- delayed set still (a crawl stopped for days: its promotion dates it, sync.lua).
local DAY_MS = 86400000
-- PRUNE_MAX: the most entries a day past their due time one revisit looks at.
local PRUNE_MAX = 32

-- revisit_claim(urls, leased, delayed, revisits, dead, id, fp)
--   KEYS: urls (revisit_urls), leased, delayed, revisits, dead (the caller's KEYS[i])
--   Rule (one revisit per URL): a URL is revisited by one entry. The entry id that last
--   revisited fingerprint fp is kept; another entry that finishes a visit of fp while that
--   one is alive is a double: it ends as an ack instead of a revisit. Alive: leased, waiting
--   in the delayed set, or pending (due, promoted to its back queue, not leased yet): one of
--   the revisits (the revisits set) that is not dead-lettered (the dead set: an entry
--   dead-lettered leaves the revisits set, dead.lua and reclaim.lua, but one dead-lettered
--   as poison before reclaim.lua did stays there up to a day past its due time). Before,
--   a pending entry gave way: a copy of its URL that finished first (a crawl without a
--   dupefilter) took the URL, and the established entry then ended as the double, its
--   visit count, validators and evidence lost. An entry found in none of them (gone:
--   dead-lettered, acked, left, or pending more than a day past its due time) gives way: if
--   it is pending still, it finds this one alive when it finishes and ends then, so a URL is
--   never revisited twice for more than one round. (A double is gone: if the entry it gave
--   way to is then dead-lettered, nothing revisits the URL until a dlq requeue.) One found
--   dead-lettered leaves fp in urls under "x:<its id>", which a requeue of it takes back
--   (revisit_rejoin).
--   Returns true when entry id revisits fp (recorded), false when it is a double.
local function revisit_claim(urls, leased, delayed, revisits, dead, id, fp)
  if fp == '' then return true end
  local other = redis.call('HGET', urls, fp)
  if other and other ~= id and (redis.call('ZSCORE', leased, other)
      or redis.call('ZSCORE', delayed, other)
      or (redis.call('ZSCORE', revisits, other) and not redis.call('ZSCORE', dead, other))) then
    return false
  end
  if other ~= id then
    redis.call('HSET', urls, fp, id)
    if other and redis.call('ZSCORE', dead, other) then
      redis.call('HSET', urls, 'x:' .. other, fp) -- what a requeue takes back (revisit_rejoin)
    end
  end
  return true
end

-- revisit_due(revisits, id, due, now, delayed)
--   KEYS: revisits, delayed (the caller's KEYS[i]; delayed may be nil: nothing forgotten)
--   Records entry id's next visit at due; forgets those a day past theirs that are not in
--   the delayed set (PRUNE_MAX of them at most). Before, it forgot those waiting there too:
--   a crawl resumed after a stop of days, with more revisits due than a round promotes,
--   lost those its first rounds had not promoted (their promotion dates members alone).
local function revisit_due(revisits, id, due, now, delayed)
  redis.call('ZADD', revisits, int_str(due), id)
  if not delayed then return end
  local late = redis.call('ZRANGEBYSCORE', revisits, '-inf', '(' .. int_str(now - DAY_MS),
    'LIMIT', 0, PRUNE_MAX)
  for _, other in ipairs(late) do
    if not redis.call('ZSCORE', delayed, other) then redis.call('ZREM', revisits, other) end
  end
end

-- revisit_leave(revisits, id, info)
--   KEYS: revisits (the caller's KEYS[i])
--   Entry id is dead-lettered: it leaves the revisits set at once (status and the
--   dashboard count that set as the revisited URLs), and its dead letter's record (info)
--   says whether it was there ("revisits": true or false), so that a requeue puts it back
--   (revisit_rejoin).
local function revisit_leave(revisits, id, info)
  info['revisits'] = redis.call('ZREM', revisits, id) == 1
end

-- revisit_rejoin(revisits, urls, id, info, now)
--   KEYS: revisits, urls (revisit_urls; the caller's KEYS[i])
--   Rule (a requeued revisit holds its URL): entry id, requeued from the dead-letter queue
--   with its record info, goes back to the revisits set, due now, if it was one of the
--   revisits when it was dead-lettered (revisit_leave; a record written before the flag:
--   if it held a share of the adaptive budget, "revisit") or a copy took its URL meanwhile
--   (revisit_claim kept the fingerprint under "x:<id>"): pending, it is alive for
--   revisit_claim, so a copy that finishes before it is leased ends as the double, not the
--   requeued entry with its history. A URL a copy took meanwhile comes back to it, unless
--   an entry of a smaller number holds it now (both ids Redis's numbers, which grow as
--   requests are enqueued): in a chain of dead letters (a copy that took the URL
--   dead-lettered in turn) the first enqueued keeps it, in whichever order they are
--   requeued. (Enqueued first is not always the entry with the history: a copy queued
--   before it and leased later, then requeued with it, keeps the URL.) The
--   entry that gives the URL up ends as the double at its next finish. Before, the requeued
--   entry was pending outside the set: a copy took the URL, and the requeued entry ended as
--   the double at its next visit. The "x:" field goes at the requeue, or with the dead
--   letter when it is purged or trimmed (lib/deadletter: drop_dead).
local function revisit_rejoin(revisits, urls, id, info, now)
  local was = info['revisits']
  local fp = redis.call('HGET', urls, 'x:' .. id)
  if fp then redis.call('HDEL', urls, 'x:' .. id) end
  if not (fp or was == true or (was == nil and type(info['revisit']) == 'table')) then
    return
  end
  revisit_due(revisits, id, now, now)
  if fp then
    -- a worker's own ids ("<hex>.<n>") are not numbers: never compared, the URL comes back
    local holder, mine = tonumber(redis.call('HGET', urls, fp)), tonumber(id)
    if not (holder and mine and holder < mine) then redis.call('HSET', urls, fp, id) end
  end
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

-- alloc_add(alloc, field, delta)
--   KEYS: alloc (revisit_alloc)
--   Adds delta to the sum in field (see the rule above: garbage, counted as
--   revisit_repaired, is made again as the sum of what the entries hold, 'e:<id>', as they
--   are when it is called: a caller changes an entry's share after; a delta that is not a
--   finite number adds nothing). Returns the sum.
local function alloc_add(alloc, field, delta)
  local v = finite(tonumber(redis.call('HGET', alloc, field) or '0'))
  if not v then -- made again from what every entry holds now (one HGETALL: once)
    count('revisit_repaired', 1)
    local h, at = redis.call('HGETALL', alloc), field == 'load' and '^(%S+) ' or ' (%S+)$'
    v = 0
    for i = 1, #h, 2 do
      if string.sub(h[i], 1, 2) == 'e:' then
        v = v + (finite(tonumber(string.match(h[i + 1], at) or '')) or 0)
      end
    end
  end
  v = finite(v + (finite(delta) or 0)) or 0
  redis.call('HSET', alloc, field, string.format('%.17g', v))
  return v
end

-- revisit_allocate(alloc, revisits, d, first, lowest, highest)
--   KEYS: alloc (revisit_alloc), revisits (the caller's KEYS[i])
--   Rule (the budget): adaptive revisits spend what the crawl can fetch. The sums of
--   1 / interval over the revisited URLs (load) and of their configured intervals (base)
--   move by what this revisit changed (d.load, d.base); the multiplier (the marginal gain
--   of freshness a visit a second must buy; scrapy_ha/config/freshness.py) grows while the
--   load is over the budget (d.budget > 0, else base), so the next intervals are longer,
--   and shrinks while under it. It starts at first.
--   Rule (no wind-up): the multiplier stays within lowest .. highest, the range where it
--   moves an interval (freshness.py multiplier_range: at highest every page is given the
--   longest interval, HA_REVISIT_MAX, at lowest the shortest, HA_REVISIT_MIN). A budget
--   the bounds cannot meet would push it further for as long as it lasts, moving nothing,
--   and then take as long to come back (to infinity and never, before this rule).
--   Returns the multiplier.
local function revisit_allocate(alloc, revisits, d, first, lowest, highest)
  local load = alloc_add(alloc, 'load', d.load)
  local base = alloc_add(alloc, 'base', d.base)
  local stored = redis.call('HGET', alloc, 'mu')
  local mu = finite(tonumber(stored or ''))
  if stored and not mu then count('revisit_repaired', 1) end
  mu = mu or first
  local target = d.budget > 0 and d.budget or base
  if target > 0 and load > 0 then
    local n = math.max(redis.call('ZCARD', revisits), 1)
    local step = (load / target) ^ (ALLOC_GAIN / n)
    mu = mu * math.min(1 + ALLOC_STEP, math.max(1 - ALLOC_STEP, step))
  end
  mu = math.min(highest, math.max(lowest, mu))
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
  if held ~= 0 then alloc_add(alloc, 'load', -held) end
  if held_base ~= 0 then alloc_add(alloc, 'base', -held_base) end
end

-- revisit_hold(alloc, id, load, d_base)
--   KEYS: alloc (revisit_alloc)
--   Rule (what an entry holds): the sums hold, for each entry revisited adaptively, 1 / its
--   interval (load, visits a second) and 1 / its configured one, recorded as 'e:<id>' when
--   it is scheduled (d_base: what this revisit added to the configured sum), so that a
--   dead letter takes them out of the sums (revisit_release) and a requeue puts them back
--   (revisit_restore).
local function revisit_hold(alloc, id, load, d_base)
  local before = redis.call('HGET', alloc, 'e:' .. id)
  local base = d_base + (finite(tonumber(before and string.match(before, ' (%S+)$') or ''))
    or 0)
  redis.call('HSET', alloc, 'e:' .. id, string.format('%.17g %.17g', load, base))
end

-- revisit_release(alloc, id)
--   KEYS: alloc (revisit_alloc)
--   Takes what entry id holds (revisit_hold) out of the sums, as it leaves the revisits
--   (a dead letter). Returns {load, base} taken out, or nil when it held nothing.
local function revisit_release(alloc, id)
  local held = redis.call('HGET', alloc, 'e:' .. id)
  local load, base = string.match(held or '', '^(%S+) (%S+)$')
  load, base = finite(tonumber(load)), finite(tonumber(base))
  if load and base then revisit_withdraw(alloc, load, base) end -- (its share still held)
  redis.call('HDEL', alloc, 'e:' .. id)
  return load and base and {load, base} or nil
end

-- revisit_restore(alloc, id, held)
--   KEYS: alloc (revisit_alloc)
--   Puts back in the sums what entry id held when it was dead-lettered (held: {load, base}
--   from its dead-letter record, revisit_release), as it is requeued: its next visit
--   counts from there, as if it had not left.
local function revisit_restore(alloc, id, held)
  local load, base = finite(tonumber(held[1])), finite(tonumber(held[2]))
  if not (load and base) then return end
  revisit_withdraw(alloc, -load, -base)
  redis.call('HSET', alloc, 'e:' .. id, string.format('%.17g %.17g', load, base))
end
