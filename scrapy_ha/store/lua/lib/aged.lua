-- lib/aged: the dupefilter's memory of when a request was seen (HA_DUPEFILTER_TTL, and a
-- request's meta["ha_recrawl_after"]): the exact set in time slices, one kind of lib/seen
-- (the scripts that enqueue, and revisit, reach it through lib/seen; a Bloom filter has no
-- age).
-- The caller names the kind with a spec, an argument of its script:
--   'set'        the one set of fingerprints (the caller's dupefilter key), kept for ever:
--                a fingerprint seen once is seen for the life of the crawl;
--   'set <ttl>'  time slices: a fingerprint seen longer ago than ttl (ms) is new again.
-- Rule (slices): the fingerprints are kept in a ring of SLICES + 1 sets (the last
-- SLICES + 1 KEYS of the script, after the slices' hash: the hash is KEYS[#KEYS - SLICES - 1]),
-- each holding those first seen while it was the newest. The hash holds each slot's start
-- (server ms, field 's<i>'). A new fingerprint goes to the newest slot; once that is
-- ttl / SLICES old, the next fingerprint opens a new slot (an empty one, else the oldest,
-- dropped whole): a slot ends ttl / SLICES after its start. A slot that
-- ended ttl ago or more is dropped whole (UNLINK: freed in the background): no scan, no
-- per-entry expiry. A fingerprint is seen for age A (ttl, or a request's shorter
-- ha_recrawl_after) while a slot that ended less than A ago, or has not ended, holds it:
-- a URL is new again between A and A + ttl / SLICES after it was last seen.
-- Rule (switching): the first slice written takes over the set kept for ever, if there is one
-- (RENAME: its fingerprints count as seen at that moment and age from there).
--- @include "types"
--- @include "number"

-- SLICES: slots that cover the ttl; one more takes the new fingerprints (scrapy_ha/keys.py
-- SEEN_SLICES: 8 keep an age within an eighth of the ttl, for 9 SISMEMBER at most).
local SLICES = {{SEEN_SLICES}}

-- aged_key_count(spec)
--   Returns how many of the script's last KEYS the dupefilter of spec takes.
local function aged_key_count(spec)
  if spec == 'set' then return 0 end
  return SLICES + 2
end

-- aged_open(script, set, spec, keys, now)
--   set: the dupefilter set (the caller's KEYS[i]); spec: see above; keys: the script's KEYS;
--   now: the server's time (ms). Returns the dupefilter to pass to aged_add and aged_touch,
--   or nil and an error reply (a bad spec, a key of the wrong type): call it before the
--   script's first write. It writes nothing itself.
local function aged_open(script, set, spec, keys, now)
  local err = wrong_type(script, {set}, {'set'})
  if err then return nil, err end
  if spec == 'set' then return {set = set} end
  local ttl = tonumber(string.match(spec or '', '^set (%d+)$') or '')
  if not ttl or ttl < SLICES or #keys < SLICES + 2 then
    return nil, redis.error_reply('ERR ' .. script .. ': bad dupefilter spec')
  end
  local first = #keys - SLICES - 1
  local d = {legacy = set, meta = keys[first], ring = {}, starts = {}, ttl = ttl,
    period = math.floor(ttl / SLICES), now = now}
  local want = {'hash'}
  local fields = {}
  for i = 0, SLICES do
    d.ring[i] = keys[first + 1 + i]
    want[#want + 1] = 'set'
    fields[#fields + 1] = 's' .. i
  end
  err = wrong_type(script, {d.meta, unpack(d.ring, 0, SLICES)}, want)
  if err then return nil, err end
  d.taken_over = redis.call('EXISTS', set) == 0 -- else taken over at the first write
  local starts = redis.call('HMGET', d.meta, unpack(fields))
  for i = 0, SLICES do d.starts[i] = tonumber(starts[i + 1] or '') end
  return d
end

-- aged_order(d)
--   Returns the slots of d that hold a start, newest first: {slot, start, end}. A slot takes
--   fingerprints until ttl / SLICES after its start (then the next write opens another), so
--   it ends then, or where the next newer slot starts if that is sooner (a ttl changed).
local function aged_order(d)
  if d.slots then return d.slots end
  local slots = {}
  for i = 0, SLICES do
    if d.starts[i] then slots[#slots + 1] = {i, d.starts[i]} end
  end
  table.sort(slots, function(a, b) return a[2] > b[2] end)
  for j = 1, #slots do
    local period_end = slots[j][2] + d.period
    slots[j][3] = j > 1 and math.min(period_end, slots[j - 1][2]) or period_end
  end
  d.slots = slots
  return slots
end

-- aged_drop(d, i)
--   Empties slot i of d (UNLINK: Redis frees it in the background) and forgets its start.
local function aged_drop(d, i)
  redis.call('UNLINK', d.ring[i])
  redis.call('HDEL', d.meta, 's' .. i)
  d.starts[i] = nil
  d.slots = nil
end

-- aged_newest(d)
--   Returns the slot new fingerprints go to. At the call's first write it drops the slots
--   that ended a ttl ago, and opens a new slot once the newest is ttl / SLICES old.
local function aged_newest(d)
  if d.newest then return d.newest end
  local slots = aged_order(d)
  for j = 1, #slots do
    if slots[j][3] <= d.now - d.ttl then aged_drop(d, slots[j][1]) end
  end
  local top = slots[1]
  if top and d.starts[top[1]] and d.now < top[2] + d.period then
    d.newest = top[1]
    return d.newest
  end
  local pick, oldest = nil, nil
  for i = 0, SLICES do
    if not d.starts[i] then pick = i break end
    if not oldest or d.starts[i] < d.starts[oldest] then oldest = i end
  end
  pick = pick or oldest
  aged_drop(d, pick)
  if not d.taken_over then
    redis.call('RENAME', d.legacy, d.ring[pick])
    d.taken_over = true
  end
  d.starts[pick] = d.now
  d.slots = nil
  redis.call('HSET', d.meta, 's' .. pick, int_str(d.now), 'period', d.period)
  d.newest = pick
  return pick
end

-- aged_seen(d, fp, age)
--   Returns true when fingerprint fp was seen less than age ms ago (the ttl when age is nil
--   or longer; see the rule above).
local function aged_seen(d, fp, age)
  if d.set then return redis.call('SISMEMBER', d.set, fp) == 1 end
  if not d.taken_over and redis.call('SISMEMBER', d.legacy, fp) == 1 then return true end
  age = math.min(age or d.ttl, d.ttl)
  for _, s in ipairs(aged_order(d)) do
    if s[3] <= d.now - age then return false end
    if redis.call('SISMEMBER', d.ring[s[1]], fp) == 1 then return true end
  end
  return false
end

-- aged_add(d, fp, age)
--   Returns true when fingerprint fp is new for age (see aged_seen): it is recorded as seen
--   now; false when it was seen within age.
local function aged_add(d, fp, age)
  if d.set then return redis.call('SADD', d.set, fp) == 1 end
  if aged_seen(d, fp, age) then return false end
  redis.call('SADD', d.ring[aged_newest(d)], fp)
  return true
end
-- aged_touch(d, fp)
--   Records fingerprint fp as seen now, whether it was seen before or not.
local function aged_touch(d, fp)
  if d.set then
    redis.call('SADD', d.set, fp)
  else
    redis.call('SADD', d.ring[aged_newest(d)], fp)
  end
end
