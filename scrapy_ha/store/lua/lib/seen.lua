-- lib/seen: the crawl's dupefilter, one interface over its two kinds (HA_DUPEFILTER), used
-- by every script that enqueues (sync, feed) and by counts:
--   'set'    the exact set: never wrong. A crawl keeps it in buckets (below) or, made by a
--            version before them, as one set of 12-byte fingerprints;
--   'bloom'  a scalable Bloom filter (Almeida et al., 2007) in plain Redis bitmaps (lib/bloom:
--            its layout, positions and growth): a few bytes per URL, and a new URL is taken
--            for one seen before (a false positive: that URL is never crawled) with at most
--            the probability asked.
-- and either with an age (HA_DUPEFILTER_TTL): time slices of it, lib/aged.
-- The caller names the kind with a spec, the script's last argument:
--   'buckets <count>'  the exact set in buckets: the dupefilter key is their meta hash;
--          <count> is the number of buckets of a crawl made now (a stored one is kept);
--          the last KEYS is the hash of the exact set's time slices (lib/aged);
--   'set'  one set, the caller's dupefilter key (a crawl made before the buckets);
--   'set <ttl>'  time slices (lib/aged): the buckets' meta hash, then the slices' hash and
--          sets are the last KEYS;
--   'bloom <capacity> <k> <part> <layers> <error>'  the dupefilter key is the filter's meta
--          hash, and the bitmaps of layers 0 .. <layers> are the last KEYS of the script,
--          layer by layer, part by part (lib/bloom); <layers> is at least the
--          number of layers that exist (and 1), so the caller passes one more: the layer
--          that takes the new URLs once the last one is full. A filter whose keys the
--          caller does not have all of is refused before any write with 'BLOOMLAYOUT
--          <capacity> <k> <part> <layers>': the caller learns the filter as stored and
--          calls again. A meta hash of time slices (lib/aged: it has a period) is
--          refused with 'SEENKIND ...' (below), before any write.
--   'bloom-ttl <ttl> <capacity> <k> <part> <error>'  time slices of Bloom filters (lib/aged):
--          the dupefilter key is their meta hash, which names their bitmaps.
-- Rule (one kind, as far as checked here): of the exact set's two forms (buckets, time
-- slices) and of the Bloom filter's two (kept for ever, time slices), a crawl keeps the
-- one of the first call that wrote one; a call whose spec names the other is refused
-- before any write (the exact set against the Bloom filter is compared at start only, where
-- the first worker also claims the crawl's kind: scrapy_ha/store/sharding.py; each shard of
-- a sharded crawl judges its own keys)
-- with 'SEENKIND <script>: <what the crawl keeps, and where>' (the worker adds its
-- settings and the fix): a second dupefilter beside the first would know none of its
-- URLs, and every URL would be crawled again. The worker checks at start
-- (scrapy_ha/store/sharding.py); this catches workers that started an empty crawl
-- together, with and without HA_DUPEFILTER_TTL, where the start's claim did not (a worker
-- of an earlier version claims none), and stops the one refused (no retry can help it:
-- scrapy_ha/store/bloom.py seen_call, DupefilterRefused).
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
--- @include "bloom"
--- @include "aged"

-- seen_key_count(spec)
--   Returns how many of the script's last KEYS the filter of spec takes (0 for 'set').
local function seen_key_count(spec)
  if string.match(spec or '', '^set %d+$') then return SLICES + 3 end -- lib/aged
  if string.match(spec or '', '^buckets %d+$') then return 1 end -- the slices' hash
  local s = bloom_spec(spec)
  if not s then return 0 end
  local n = 0
  for i = 0, s.known do n = n + #bloom_layer(s, i).sizes end
  return n
end

-- bloom_open(script, meta, spec, keys)
--   Returns the filter of spec (meta hash meta, bitmaps the last KEYS of keys), or nil and
--   an error reply; see seen_open.
local function bloom_open(script, meta, spec, keys)
  local s = bloom_spec(spec)
  if not s then return nil, redis.error_reply('ERR ' .. script .. ': bad dupefilter spec') end
  local err = wrong_type(script, {meta}, {'hash'})
  if err then return nil, err end
  local stored = redis.call('HMGET', meta, 'capacity', 'k', 'part', 'layers', 'period')
  if stored[5] then -- lib/aged's slices: a second filter in the hash would know none of theirs
    return nil, redis.error_reply('SEENKIND ' .. script .. ': ' .. meta .. ' keeps the '
      .. 'Bloom filter in time slices (HA_DUPEFILTER_TTL)')
  end
  err = BLOOM.meta_bad(script, meta)
  if not err and stored[1] and not stored[4] then
    err = redis.error_reply('ERR ' .. script .. ': unreadable Bloom filter meta ' .. meta
      .. ': layers is missing beside its capacity (restore or delete it)')
  end
  if err then return nil, err end
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

-- buckets_open(script, meta, spec, now, aged)
--   Returns the exact set in buckets (meta hash meta), or nil and an error reply; the
--   count stored is kept, the spec's is that of a crawl made now. Buckets not made yet
--   are refused (SEENKIND) when the hash aged of the exact set's time slices exists.
local function buckets_open(script, meta, spec, now, aged)
  local want = tonumber(string.match(spec, '^buckets (%d+)$'))
  if not want or want < 1 then
    return nil, redis.error_reply('ERR ' .. script .. ': bad dupefilter spec')
  end
  local err = wrong_type(script, {meta}, {'hash'})
  if err then return nil, err end
  local stored = redis.call('HMGET', meta, 'buckets', 'gen')
  local buckets, gen = tonumber(stored[1]), stored[2]
  local fresh = not (buckets and gen)
  if fresh and aged and redis.call('EXISTS', aged) == 1 then
    return nil, redis.error_reply('SEENKIND ' .. script .. ': ' .. aged .. ' keeps the '
      .. 'exact set in time slices (HA_DUPEFILTER_TTL)')
  end
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
--   key of the wrong type, BLOOMLAYOUT, SEENKIND): call it before the script's first write,
--   so that a refusal leaves nothing half done.
local function seen_open(script, key, spec, keys, now)
  if spec == 'set' then
    local err = wrong_type(script, {key}, {'set'})
    if err then return nil, err end
    return {set = key}
  end
  if string.match(spec or '', '^set ') then
    return aged_open(script, key, spec, keys, now)
  end
  if string.match(spec or '', '^buckets ') then
    return buckets_open(script, key, spec, now, keys[#keys])
  end
  if string.match(spec or '', '^bloom%-ttl ') then
    return aged_bloom_open(script, key, spec, now)
  end
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
  for i = d.layers - 2, 0, -1 do -- the full layers: read
    if bloom_probe(d.L[i], fp, false) then return false end
  end
  return bloom_insert(d, fp)
end

-- seen_touch(d, fp)
--   Records fingerprint fp as seen now, whether it was seen before or not (the newest time
--   slice takes it again: its age starts now; the set and a Bloom filter keep it as it is).
local function seen_touch(d, fp)
  if d.ring then return aged_add(d, fp, nil, true) end
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
  if d.ring then return aged_close(d) end
  if d.set or not (d.grown or next(d.added)) then return end
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
