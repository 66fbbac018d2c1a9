-- lib/aged: the dupefilter's memory of when a request was seen (HA_DUPEFILTER_TTL, and a
-- request's meta["ha_recrawl_after"]): the exact set, or the Bloom filter, in time slices,
-- kinds of lib/seen (the scripts that enqueue, and revisit, reach it through lib/seen).
-- The caller names the kind with a spec, an argument of its script:
--   'set'        the one set of fingerprints (the caller's dupefilter key), kept for ever:
--                a fingerprint seen once is seen for the life of the crawl;
--   'set <ttl>'  time slices: a fingerprint seen longer ago than ttl (ms) is new again;
--   'bloom-ttl <ttl> <capacity> <k> <part> <error>'  time slices of Bloom filters (below).
-- Rule (slices): the fingerprints are kept in a ring of SLICES + 1 slots (for the set, the
-- last SLICES + 1 KEYS of the script, after the slices' hash: the hash is
-- KEYS[#KEYS - SLICES - 1], and the buckets' meta hash the one before it, read only to
-- refuse a second kind of dupefilter: lib/seen's rule, one kind), each holding those first
-- seen while it was the newest. The
-- hash holds each slot's start (server ms, field 's<i>'), and 'period' (ttl / SLICES) of
-- the last call that wrote (each call's first write sets it if it differs: a run of
-- another TTL; the tools, `seen check` and the counts, read the TTL from it, as the
-- workers of the crawl apply it). A new fingerprint goes to the
-- newest slot; once that is ttl / SLICES old, the next fingerprint opens a new slot (an
-- empty one, else the oldest, dropped whole): a slot ends ttl / SLICES after its start. A
-- slot that ended ttl ago or more is dropped whole (UNLINK: freed in the background): no
-- scan, no per-entry expiry. A fingerprint is seen for age A (ttl, or a request's shorter
-- ha_recrawl_after) while a slot that ended less than A ago, or has not ended, holds it:
-- a URL is new again between A and A + ttl / SLICES after it was last seen.
-- Rule (switching): the first slice written takes over the set kept for ever, if there is one
-- (RENAME: its fingerprints count as seen at that moment and age from there).
-- Rule (Bloom slices): with HA_DUPEFILTER = "bloom" each slot is a scalable Bloom filter
-- (lib/bloom: its layout, positions and growth) of the spec's capacity, k and part, or of
-- those stored (the first call stores them: every slot has one layout). The slots' hash
-- is the filter's meta hash, the caller's dupefilter key, and a slot's bitmaps are named
-- from it, '<meta>:s<slot>:<layer>:<part>' (part from 0): the meta key carries the
-- crawl's hash tag, so they are in its slot, as the buckets are. A check reads the slots
-- within its age, whose errors add up (SLICES + 1 of them at most): the worker makes each
-- slot err at most the crawl's rate / (SLICES + 1) (scrapy_ha/store/aged.py). The meta
-- hash: capacity, k, part, error (the crawl's rate asked), period, and s<i>; l<i> (layers
-- of slot i), n<i>:<j> (URLs added to its layer j); n (URLs the live slots hold), fp (the
-- false positives to expect so far: each URL added adds the slots' error at that time).
--- @include "types"
--- @include "number"
--- @include "bloom"

-- SLICES: slots that cover the ttl; one more takes the new fingerprints (scrapy_ha/keys.py
-- SEEN_SLICES: 8 keep an age within an eighth of the ttl, for 9 SISMEMBER at most).
local SLICES = {{SEEN_SLICES}}

-- aged_open(script, set, spec, keys, now)
--   set: the dupefilter set (the caller's KEYS[i]); spec: see above; keys: the script's KEYS;
--   now: the server's time (ms). Returns the dupefilter to pass to aged_add,
--   or nil and an error reply (a bad spec, a key of the wrong type; SEENKIND when no slice
--   was written yet and the exact set's buckets were: lib/seen's rule, one kind): call it
--   before the script's first write. It writes nothing itself.
local function aged_open(script, set, spec, keys, now)
  local err = wrong_type(script, {set}, {'set'})
  if err then return nil, err end
  if spec == 'set' then return {set = set} end
  local ttl = tonumber(string.match(spec or '', '^set (%d+)$') or '')
  if not ttl or ttl < SLICES or #keys < SLICES + 3 then
    return nil, redis.error_reply('ERR ' .. script .. ': bad dupefilter spec')
  end
  local first = #keys - SLICES - 1
  local buckets = keys[first - 1] -- the buckets' meta hash: the crawl's, if written first
  local d = {legacy = set, meta = keys[first], ring = {}}
  local want = {'hash'}
  for i = 0, SLICES do
    d.ring[i] = keys[first + 1 + i]
    want[#want + 1] = 'set'
  end
  err = wrong_type(script, {d.meta, unpack(d.ring, 0, SLICES)}, want)
  if err then return nil, err end
  if redis.call('EXISTS', d.meta) == 0 and redis.call('EXISTS', buckets) == 1 then
    return nil, redis.error_reply('SEENKIND ' .. script .. ': ' .. buckets .. ' keeps the '
      .. 'exact set for ever (no HA_DUPEFILTER_TTL)')
  end
  d.taken_over = redis.call('EXISTS', set) == 0 -- else taken over at the first write
  d.ttl, d.period, d.now = ttl, math.floor(ttl / SLICES), now
  return d
end

-- aged_bloom_open(script, meta, spec, now)
--   meta: the filter's meta hash (the caller's dupefilter key); spec: 'bloom-ttl ...'.
--   Returns the Bloom slices, or nil and an error reply (a bad spec, a key of the wrong
--   type, a filter kept for ever); it writes nothing itself.
local function aged_bloom_open(script, meta, spec, now)
  local ttl, cap, k, part, asked = string.match(spec or '',
    '^bloom%-ttl (%d+) (%d+) (%d+) (%d+) (%S+)$')
  ttl, cap, k, part = tonumber(ttl), tonumber(cap), tonumber(k), tonumber(part)
  if not (ttl and cap and k and part and tonumber(asked)) or ttl < SLICES or cap < 1
      or k < 1 or k > BLOOM.MAX_K or part < 1 then
    return nil, redis.error_reply('ERR ' .. script .. ': bad dupefilter spec')
  end
  local err = wrong_type(script, {meta}, {'hash'}) or BLOOM.meta_bad(script, meta)
  if err then return nil, err end
  local stored = redis.call('HMGET', meta, 'capacity', 'k', 'part', 'period')
  if stored[1] and not stored[4] then
    return nil, redis.error_reply('SEENKIND ' .. script .. ': ' .. meta .. ' is a Bloom '
      .. 'filter kept for ever, not in time slices (no HA_DUPEFILTER_TTL)')
  end
  local d = {meta = meta, ring = {}, filters = {}, layouts = {}, taken_over = true,
    fresh = not stored[1], bloom = {cap = cap, k = k, part = part, asked = asked}}
  if stored[1] then
    d.bloom.cap, d.bloom.k, d.bloom.part = tonumber(stored[1]), tonumber(stored[2]),
      tonumber(stored[3])
  end
  d.ttl, d.period, d.now = ttl, math.floor(ttl / SLICES), now
  return d
end

-- aged_filter(d, i)
--   Returns slot i of the Bloom slices d as a filter (lib/bloom): its layers as stored, and
--   the next one, which a full newest layer grows into (called again after it grew, it
--   adds the next). A layer's parts are named from the meta hash; its layout is every
--   slot's (d.layouts), so that a URL's positions in it are computed once (lib/bloom).
local function aged_filter(d, i)
  local f = d.filters[i]
  if not f then
    f = {L = {}, added = {}, layers = tonumber(redis.call('HGET', d.meta, 'l' .. i)) or 0}
    d.filters[i] = f
  end
  for j = 0, f.layers do
    if not f.L[j] then
      local shape = d.layouts[j] or bloom_layer(d.bloom, j)
      d.layouts[j] = shape -- one per layer: its URL's positions are the slots' (pos)
      local L = {m = shape.m, k = shape.k, cap = shape.cap, sizes = shape.sizes,
        pos = shape.pos, keys = {}, n = 0}
      for p = 1, #L.sizes do L.keys[p] = d.meta .. ':s' .. i .. ':' .. j .. ':' .. (p - 1) end
      if j < f.layers then
        L.n = tonumber(redis.call('HGET', d.meta, 'n' .. i .. ':' .. j)) or 0
      end
      f.L[j] = L
    end
  end
  return f
end

-- aged_slot(d, i, fp, put)
--   put false: returns whether slot i of d holds fingerprint fp; put true: records fp there.
local function aged_slot(d, i, fp, put)
  if not d.bloom then
    return redis.call(put and 'SADD' or 'SISMEMBER', d.ring[i], fp) == 1
  end
  local f = aged_filter(d, i)
  if put then return bloom_insert(f, fp) end
  for j = f.layers - 1, 0, -1 do
    if bloom_probe(f.L[j], fp, false) then return true end
  end
  return false
end

-- aged_order(d)
--   Returns the slots of d that hold a start, newest first: {slot, start, end} (the
--   starts are read from the hash at the first call). A slot takes
--   fingerprints until ttl / SLICES after its start (then the next write opens another), so
--   it ends then, or where the next newer slot starts if that is sooner (a ttl changed).
local function aged_order(d)
  if d.slots then return d.slots end
  if not d.starts then -- the first call: the slots' starts, from the hash
    local fields = {}
    for i = 0, SLICES do fields[i + 1] = 's' .. i end
    fields[SLICES + 2] = 'period'
    local starts = redis.call('HMGET', d.meta, unpack(fields))
    d.starts = {}
    for i = 0, SLICES do d.starts[i] = tonumber(starts[i + 1] or '') end
    d.stored_period = tonumber(starts[SLICES + 2] or '')
  end
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
--   Empties slot i of d (UNLINK: Redis frees it in the background) and forgets its start
--   (and, for a Bloom filter, its layers and the URLs it held).
local function aged_drop(d, i)
  if d.bloom then
    local f = aged_filter(d, i)
    local fields, held = {'l' .. i}, 0
    for j = 0, f.layers - 1 do
      for _, key in ipairs(f.L[j].keys) do redis.call('UNLINK', key) end
      fields[#fields + 1] = 'n' .. i .. ':' .. j
      held = held + f.L[j].n
    end
    redis.call('HDEL', d.meta, unpack(fields))
    if held > 0 then redis.call('HINCRBY', d.meta, 'n', -held) end
    d.filters[i] = nil
  else
    redis.call('UNLINK', d.ring[i])
  end
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
    if d.stored_period ~= d.period then -- a run of another TTL: the tools read it here
      redis.call('HSET', d.meta, 'period', d.period)
      d.stored_period = d.period
    end
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
  d.stored_period = d.period
  if d.fresh then
    local s = d.bloom
    redis.call('HSET', d.meta, 'capacity', s.cap, 'k', s.k, 'part', s.part, 'error', s.asked)
    d.fresh = false
  end
  d.newest = pick
  return pick
end

-- aged_seen(d, fp, age)
--   Returns the start (ms) of the newest slot that holds fingerprint fp and was live less
--   than age ms ago (the ttl when age is nil or longer; see the rule above), true when the
--   set kept for ever holds it, or false.
local function aged_seen(d, fp, age)
  if d.set then return redis.call('SISMEMBER', d.set, fp) == 1 end
  if not d.taken_over and redis.call('SISMEMBER', d.legacy, fp) == 1 then return true end
  age = math.min(age or d.ttl, d.ttl)
  for _, s in ipairs(aged_order(d)) do
    if s[3] <= d.now - age then return false end
    if aged_slot(d, s[1], fp) then return s[2] end
  end
  return false
end

-- aged_add(d, fp, age, touch)
--   Returns true when fingerprint fp is new for age (see aged_seen): it is recorded as seen
--   now; false when it was seen within age. With touch, it is recorded as seen now whether
--   it was seen before or not.
local function aged_add(d, fp, age, touch)
  if d.set then return redis.call('SADD', d.set, fp) == 1 end
  if not touch and aged_seen(d, fp, age) then return false end
  aged_slot(d, aged_newest(d), fp, true)
  return true
end

-- aged_close(d)
--   Writes what this call added to the Bloom slices d (each slot's layers and URLs, the
--   URLs held, and the false positives to expect: each URL adds the chance now that a new
--   URL is taken for a seen one, the sum of the live slots' as a check reads them all at
--   the ttl); call it once, after the last write.
local function aged_close(d)
  if not d.bloom then return end
  local total, error = 0, 0
  for i, f in pairs(d.filters) do
    if f.grown then redis.call('HSET', d.meta, 'l' .. i, f.layers) end
    for j, n in pairs(f.added) do
      redis.call('HINCRBY', d.meta, 'n' .. i .. ':' .. j, n)
      total = total + n
    end
  end
  if total == 0 then return end
  for _, s in ipairs(aged_order(d)) do error = error + bloom_error(aged_filter(d, s[1])) end
  redis.call('HINCRBY', d.meta, 'n', total)
  redis.call('HINCRBYFLOAT', d.meta, 'fp', string.format('%.17g', error * total))
end
