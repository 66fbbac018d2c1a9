-- counts: the size of every state of a crawl, read at one instant (it writes nothing).
-- KEYS[1] ready  KEYS[2] waiting  KEYS[3] queued (lib/frontier)  KEYS[4] leased
-- KEYS[5] delayed  KEYS[6] dead  KEYS[7] workers
-- KEYS[8] dupefilter (the exact set made before the buckets)  KEYS[9] the Bloom filter's
-- meta hash (lib/seen; in time slices, its URLs counted by the rule of the set's below)
-- KEYS[11] the exact set's buckets' meta hash (lib/seen: it counts them): a crawl has one
-- of the three
-- KEYS[10] pending: requests in the form of before the back queues, not converted yet
-- (convert.lua)  KEYS[12] the exact set's time slices' hash (lib/aged)  KEYS[13..] its slots,
-- counted while a request would be filtered by them: a slot that ended a TTL ago is
-- dropped only at the crawl's next write, so a crawl at rest keeps it, seen no more
-- ARGV[1] 'strict' (the operator's tools): a key of the frontier of another type is an
--   error (WRONGTYPE: the tool names the key); else (a worker) its requests count 0, the
--   worker's next sync setting it aside
-- Returns {now_ms, pending, leased, delayed, dead, live workers, fingerprints} (a
-- fingerprint in two slices is counted twice).
--- @include "time"
--- @include "frontier"
--- @include "seen"
local now = now_ms()
frontier_open(nil, KEYS[1], KEYS[2], KEYS[3], false, false)
local pending
if ARGV[1] == 'strict' then -- (a QA run: a ready key of garbage read "pending 0" in every tool)
  pending = frontier_pending(true, false)
else
  local ok
  ok, pending = pcall(frontier_pending, true, false)
  if not ok then pending = 0 end -- a key of another type is set aside by the next sync
end
local old = redis_call('TYPE', KEYS[10])['ok'] == 'zset' and redis_call('ZCARD', KEYS[10]) or 0
-- The fingerprints the exact set's slices hold within the TTL (lib/aged's rule).
local function live_slices()
  local period = #KEYS > 12 and tonumber(redis_call('HGET', KEYS[12], 'period') or '')
  local d = period and aged_open('counts', KEYS[8], 'set ' .. (period * SLICES), KEYS, now)
  local n = 0
  if not d then -- no slot opened yet (or one of garbage): every set counts
    for i = 13, #KEYS do n = n + redis_call('SCARD', KEYS[i]) end
    return n
  end
  for _, slot in ipairs(aged_order(d)) do
    if slot[3] > now - d.ttl then n = n + redis_call('SCARD', d.ring[slot[1]]) end
  end
  return n
end
-- The URLs a Bloom filter in time slices holds within the TTL (its 'n' counts every slot
-- held, those that ended a TTL ago too, until the crawl's next write drops them); a filter
-- kept for ever: its 'n'.
local function live_bloom(key)
  local period = redis_call('TYPE', key)['ok'] == 'hash'
    and tonumber(redis_call('HGET', key, 'period') or '')
  if not period then return seen_count(key) end
  local d = {meta = key, period = period, ttl = period * SLICES, now = now}
  local n = 0
  for _, slot in ipairs(aged_order(d)) do
    if slot[3] > now - d.ttl then
      for j = 0, (tonumber(redis_call('HGET', key, 'l' .. slot[1]) or '') or 0) - 1 do
        n = n + (tonumber(redis_call('HGET', key, 'n' .. slot[1] .. ':' .. j) or '') or 0)
      end
    end
  end
  return n
end
local function live_seen()
  return live_slices() + live_bloom(KEYS[9])
end
local live
if ARGV[1] == 'strict' then
  live = live_seen()
else
  local ok
  ok, live = pcall(live_seen)
  if not ok then live = 0 end -- a key of another type is set aside by the next sync
end
local fingerprints = seen_count(KEYS[8]) + seen_count(KEYS[11]) + live
return {now, pending + old, redis_call('ZCARD', KEYS[4]), redis_call('ZCARD', KEYS[5]),
  redis_call('ZCARD', KEYS[6]), redis_call('ZCOUNT', KEYS[7], now, '+inf'), fingerprints}
