-- lib/seen: the crawl's dupefilter, one interface over its two kinds (HA_DUPEFILTER), used
-- by every script that enqueues (sync, feed) and by counts:
--   'set'    the exact set: never wrong. A crawl keeps it in buckets (below) or, made by a
--            version before them, as one set of 12-byte fingerprints;
--   'bloom'  a scalable Bloom filter (Almeida et al., 2007) in plain Redis bitmaps: a few
--            bytes per URL, and a new URL is taken for one seen before (a false positive:
--            that URL is never crawled) with at most the probability asked.
-- and the exact set with an age (HA_DUPEFILTER_TTL): time slices of it, lib/aged.
-- The caller names the kind with a spec, the script's last argument:
--   'buckets <count>'  the exact set in buckets: the dupefilter key is their meta hash;
--          <count> is the number of buckets of a crawl made now (a stored one is kept);
--   'set'  one set, the caller's dupefilter key (a crawl made before the buckets);
--   'set <ttl>'  time slices (lib/aged): the slices' hash and sets are the last KEYS;
--   'bloom <capacity> <k> <part> <layers> <error>'  the dupefilter key is the filter's meta
--          hash, and the bitmaps of layers 0 .. <layers> are the last KEYS of the script,
--          layer by layer, part by part (see the layout below); <layers> is at least the
--          number of layers that exist (and 1), so the caller passes one more: the layer
--          that takes the new URLs once the last one is full.
-- Rule (the layout): layer i holds capacity * 2^i URLs with k + i bit positions each, in
-- ceil(capacity * 2^i * (k + i) / ln 2) bits or a few more: the bits are split into parts
-- (one string key each) whose sizes are allocation classes of Redis's allocator (jemalloc:
-- four per doubling), so that no byte of a part is allocated unused, each at most <part>
-- bytes (a Redis string holds 512 MB). At capacity half the bits of a layer are set and it
-- errs with probability 2^-(k+i); every layer together, below 2^-(k-1). The worker picks
-- k so that 2^-(k-1) <= the rate asked; scrapy_ha/store/bloom.py computes the same layout.
-- Rule (positions): h1 and h2 are bytes 5-10 and 11-16 of the fingerprint (bytes 1-4 place
-- the request on a shard), 48 bits each, exact in a Lua number; the k positions of a layer
-- of m bits are enhanced double hashing: x = h1 mod m, y = h2 mod m, then x += y, y += i.
-- Rule (growth): a URL not in any layer is added to the newest; once that layer holds its
-- capacity, the next layer is created (its parts allocated whole, zeroed) and takes the new
-- URLs. A filter whose keys the caller does not have all of is refused before any write
-- with 'BLOOMLAYOUT <capacity> <k> <part> <layers>': the caller learns the filter as stored
-- and calls again.
-- The meta hash: capacity, k, part, error (as created); layers; n (URLs added in all);
-- n:<i> (URLs added to layer i); fp (the false positives to expect so far: each URL added
-- adds the filter's error at that time).
-- Rule (buckets): the exact set is split into <count> sets (a power of two, 4096 or more)
-- named '<meta>:<gen>:<i>'; a fingerprint's bucket is its bytes 9-12 (an unsigned 32-bit
-- integer) modulo the count, its member bytes 1-8 as a signed 64-bit integer, in decimal
-- (Lua 5.1 has no 64-bit integers: the worker sends bytes 9-12 raw, then the decimal; see
-- scrapy_ha/store/buckets.py). 64 bits + log2(count) >= 76 bits tell URLs apart. A bucket
-- of at most 512 members (set-max-intset-entries) is an intset: 8 bytes a URL. The meta
-- hash: buckets (the count), gen (the server's ms when it was made: a crawl made again
-- after a finish or flush never meets buckets of the one before, deleted in batches after
-- it), n (fingerprints held, kept by every script that adds or removes one).
--- @include "number"
--- @include "types"
--- @include "aged"

-- SDS: the bytes Redis adds to a string of 64 KB .. 4 GB (header 9, terminator 1).
local SDS = 10
-- SMALL, TAIL: a remainder of a layer of at most SMALL bytes, or at most 1/TAIL of the
-- layer, is one part as it is (its rounding costs a few KB, or 0.4 % at most): few parts.
local SMALL, TAIL = 65536, 64
-- INV_LN2: bits per URL and per position (m / n = k / ln 2 makes half the bits set at
-- capacity); the same literal in scrapy_ha/store/bloom.py.
local INV_LN2 = 1.4426950408889634

-- bloom_spec(spec)
--   Returns the fields of a 'bloom ...' spec as a table, or nil when it is not one.
local function bloom_spec(spec)
  local cap, k, part, known, asked = string.match(spec or '',
    '^bloom (%d+) (%d+) (%d+) (%d+) (%S+)$')
  cap, k, part, known = tonumber(cap), tonumber(k), tonumber(part), tonumber(known)
  if not (cap and k and part and known and tonumber(asked)) or cap < 1 or k < 1 or k > 60
      or part < 1 or known > 64 then
    return nil
  end
  return {cap = cap, k = k, part = part, known = known, asked = asked}
end

-- bloom_fitted(rest)
--   Returns the largest part of at most rest bytes whose allocation is a size class.
local function bloom_fitted(rest)
  local g = 1
  while g * 2 <= rest + SDS do g = g * 2 end
  for j = 3, 1, -1 do
    local c = g + j * (g / 4)
    if c - SDS <= rest then return c - SDS end
  end
  return g - SDS
end

-- bloom_layer(s, i)
--   Returns layer i of the filter of spec s: {m = bits, k, cap, sizes = {bytes of each part}}.
local function bloom_layer(s, i)
  local scale = 1
  for _ = 1, i do scale = scale * 2 end
  local k = s.k + i
  local total = math.ceil(math.ceil(s.cap * scale * k * INV_LN2) / 8)
  local rest, sizes, m = total, {}, 0
  while rest > 0 do
    local size = rest
    if rest >= s.part then size = s.part
    elseif rest > SMALL and rest * TAIL > total then size = bloom_fitted(rest) end
    sizes[#sizes + 1] = size
    m = m + size * 8
    rest = rest - size
  end
  return {m = m, k = k, cap = s.cap * scale, sizes = sizes}
end

-- seen_key_count(spec)
--   Returns how many of the script's last KEYS the filter of spec takes (0 for 'set').
local function seen_key_count(spec)
  if string.match(spec or '', '^set %d+$') then return aged_key_count(spec) end
  local s = bloom_spec(spec)
  if not s then return 0 end
  local n = 0
  for i = 0, s.known do n = n + #bloom_layer(s, i).sizes end
  return n
end

-- bloom_bit(L, p)
--   Returns the part (its index in L.keys) and the offset in it of bit p of layer L.
local function bloom_bit(L, p)
  local sizes = L.sizes
  for j = 1, #sizes do
    local bits = sizes[j] * 8
    if p < bits then return j, p end
    p = p - bits
  end
  return #sizes, p -- not reached: p < m
end

-- bloom_probe(L, h1, h2, write)
--   Reads (write false) or sets (write true) the k bits of the URL (h1, h2) in layer L, one
--   BITFIELD call per part they fall in (BITFIELD's k operations are most of the cost of a
--   URL). Returns whether every one of them was set before.
local function bloom_probe(L, h1, h2, write)
  local m, step = L.m, write and 4 or 3
  local x, y = h1 % m, h2 % m
  local ops = {}
  for i = 1, L.k do
    local j, off = bloom_bit(L, x)
    local a = ops[j]
    if not a then
      a = {n = 0}
      ops[j] = a
    end
    local at = a.n
    a[at + 1], a[at + 2], a[at + 3] = write and 'SET' or 'GET', 'u1', off
    if write then a[at + 4] = 1 end
    a.n = at + step
    x = x + y
    if x >= m then x = x % m end
    y = y + i
    if y >= m then y = y % m end
  end
  local all = true
  for j, a in pairs(ops) do
    local old = redis.call(write and 'BITFIELD' or 'BITFIELD_RO', L.keys[j], unpack(a, 1, a.n))
    for _, bit in ipairs(old) do
      if bit == 0 then
        all = false
        break
      end
    end
    if not (all or write) then return false end
  end
  return all
end

-- bloom_error(f)
--   Returns the probability that filter f takes a new URL for a seen one now (the sum of
--   its layers': a bound, exact to the first order).
local function bloom_error(f)
  local error = 0
  for i = 0, f.layers - 1 do
    local L = f.L[i]
    error = error + (1 - math.exp(-L.k * L.n / L.m)) ^ L.k
  end
  return error
end

-- bloom_grow(f)
--   Creates layer f.layers of filter f (its parts allocated whole, zeroed).
local function bloom_grow(f)
  local L = f.L[f.layers]
  for j = 1, #L.sizes do
    redis.call('DEL', L.keys[j]) -- a part left over from a filter deleted whole before
    redis.call('SETBIT', L.keys[j], L.sizes[j] * 8 - 1, 0)
  end
  f.layers = f.layers + 1
  f.grown = true
end

-- bloom_open(script, meta, spec, keys)
--   Returns the filter of spec (meta hash meta, bitmaps the last KEYS of keys), or nil and
--   an error reply; see seen_open.
local function bloom_open(script, meta, spec, keys)
  local s = bloom_spec(spec)
  if not s then return nil, redis.error_reply('ERR ' .. script .. ': bad dupefilter spec') end
  local err = wrong_type(script, {meta}, {'hash'})
  if err then return nil, err end
  local stored = redis.call('HMGET', meta, 'capacity', 'k', 'part', 'layers')
  local layers = tonumber(stored[4]) or 0
  if stored[1] and (tonumber(stored[1]) ~= s.cap or tonumber(stored[2]) ~= s.k
      or tonumber(stored[3]) ~= s.part or layers > s.known) then
    return nil, redis.error_reply(string.format('BLOOMLAYOUT %s %s %s %s', stored[1],
      stored[2] or '', stored[3] or '', int_str(layers)))
  end
  local f = {meta = meta, spec = s, L = {}, layers = layers, added = {}, fresh = not stored[1]}
  local first = #keys - seen_key_count(spec)
  for i = 0, s.known do
    local L = bloom_layer(s, i)
    L.keys = {}
    local want = {}
    for j = 1, #L.sizes do
      first = first + 1
      L.keys[j], want[j] = keys[first], 'string'
      if first < 1 or not keys[first] then
        return nil, redis.error_reply('ERR ' .. script .. ': the dupefilter lacks keys')
      end
    end
    err = wrong_type(script, L.keys, want)
    if err then return nil, err end
    L.n = i < layers and (tonumber(redis.call('HGET', meta, 'n:' .. i)) or 0) or 0
    f.L[i] = L
  end
  return f
end

-- buckets_prefix(meta, gen)
--   Returns what the name of every bucket of generation gen of meta hash meta starts with
--   (its number follows).
local function buckets_prefix(meta, gen)
  return meta .. ':' .. gen .. ':'
end

-- buckets_open(script, meta, spec, now)
--   Returns the exact set in buckets (meta hash meta), or nil and an error reply; the
--   count stored is kept, the spec's is that of a crawl made now.
local function buckets_open(script, meta, spec, now)
  local want = tonumber(string.match(spec, '^buckets (%d+)$'))
  if not want or want < 1 then
    return nil, redis.error_reply('ERR ' .. script .. ': bad dupefilter spec')
  end
  local err = wrong_type(script, {meta}, {'hash'})
  if err then return nil, err end
  local stored = redis.call('HMGET', meta, 'buckets', 'gen')
  local buckets, gen = tonumber(stored[1]), stored[2]
  local fresh = not (buckets and gen)
  if fresh then buckets, gen = want, int_str(now) end
  return {meta = meta, buckets = buckets, gen = gen, prefix = buckets_prefix(meta, gen),
    added = 0, fresh = fresh}
end

-- bucket_of(d, fp)
--   Returns the bucket key and the member of fingerprint fp (in the form the worker sends:
--   bytes 9-12 raw, then the member in decimal) in the buckets d.
local function bucket_of(d, fp)
  local a, b, c, e = string.byte(fp, 1, 4)
  local bucket = (((a * 256 + b) * 256 + c) * 256 + e) % d.buckets
  return d.prefix .. bucket, string.sub(fp, 5)
end

-- seen_open(script, key, spec, keys, now)
--   key: the dupefilter (the set, or the filter's meta hash); spec: see above; keys: the
--   script's KEYS; now: the server's time (ms; for the time slices). Returns the
--   dupefilter to pass to seen_add and seen_close, or nil and an error reply (a bad spec, a
--   key of the wrong type, BLOOMLAYOUT): call it before the script's first write, so that
--   a refusal leaves nothing half done.
local function seen_open(script, key, spec, keys, now)
  if spec == 'set' then
    local err = wrong_type(script, {key}, {'set'})
    if err then return nil, err end
    return {set = key}
  end
  if string.match(spec or '', '^set ') then return aged_open(script, key, spec, keys, now) end
  if string.match(spec or '', '^buckets ') then return buckets_open(script, key, spec, now) end
  return bloom_open(script, key, spec, keys)
end

-- seen_add(d, fp, age)
--   Returns true when fingerprint fp is new (it is recorded now), false when seen before
--   (with time slices: seen within age ms, the ttl when nil or longer; see lib/aged).
local function seen_add(d, fp, age)
  if d.prefix then
    local key, member = bucket_of(d, fp)
    if redis.call('SADD', key, member) == 0 then return false end
    d.added = d.added + 1
    return true
  end
  if d.set then return redis.call('SADD', d.set, fp) == 1 end
  if d.ring then return aged_add(d, fp, age) end
  local b = {string.byte(fp, 5, 16)}
  local h1, h2 = 0, 0
  for i = 1, 6 do
    h1 = h1 * 256 + (b[i] or 0)
    h2 = h2 * 256 + (b[i + 6] or 0)
  end
  for i = d.layers - 2, 0, -1 do -- the full layers: read
    if bloom_probe(d.L[i], h1, h2, false) then return false end
  end
  local last = d.L[d.layers - 1]
  if not last or (last.n >= last.cap and d.L[d.layers]) then -- the first, or a full one
    if last and bloom_probe(last, h1, h2, false) then return false end
    bloom_grow(d)
  end
  local top = d.layers - 1
  local L = d.L[top]
  -- set in the newest layer: if every bit was set already, nothing changed and it is seen
  if bloom_probe(L, h1, h2, true) then return false end
  L.n = L.n + 1
  d.added[top] = (d.added[top] or 0) + 1
  return true
end

-- seen_touch(d, fp)
--   Records fingerprint fp as seen now, whether it was seen before or not (a time slice
--   takes it again: its age starts now; the set and a Bloom filter keep it as it is).
local function seen_touch(d, fp)
  if d.ring then return aged_touch(d, fp) end
  seen_add(d, fp)
end

-- seen_close(d)
--   Writes what this call added (call it once, after the last seen_add).
local function seen_close(d)
  if d.prefix then
    if d.added == 0 then return end
    if d.fresh then redis.call('HSET', d.meta, 'buckets', d.buckets, 'gen', d.gen) end
    redis.call('HINCRBY', d.meta, 'n', d.added)
    return
  end
  if d.set or d.ring or not (d.grown or next(d.added)) then return end
  local s, meta, total = d.spec, d.meta, 0
  if d.fresh then
    redis.call('HSET', meta, 'capacity', s.cap, 'k', s.k, 'part', s.part, 'error', s.asked)
  end
  for i, n in pairs(d.added) do
    redis.call('HINCRBY', meta, 'n:' .. i, n)
    total = total + n
  end
  redis.call('HSET', meta, 'layers', d.layers)
  redis.call('HINCRBY', meta, 'n', total)
  redis.call('HINCRBYFLOAT', meta, 'fp', string.format('%.17g', bloom_error(d) * total))
end

-- seen_remove(d, fp)
--   Removes fingerprint fp from the exact set's buckets d (scrapy-ha seen forget); returns
--   whether it was held. Call seen_close after the last.
local function seen_remove(d, fp)
  if #fp < 5 then return false end
  local key, member = bucket_of(d, fp)
  if redis.call('SREM', key, member) == 0 then return false end
  d.added = d.added - 1
  return true
end

-- seen_count(key)
--   Returns the URLs the dupefilter at key holds (the set's size, or the URLs a filter
--   or the buckets added: their meta hash's n).
local function seen_count(key)
  if redis.call('TYPE', key)['ok'] == 'hash' then
    return tonumber(redis.call('HGET', key, 'n')) or 0
  end
  return redis.call('SCARD', key)
end
