-- lib/bloom: a scalable Bloom filter (Almeida et al., 2007) in plain Redis bitmaps, the rules
-- of its layout, of a URL's bit positions and of its growth: lib/seen keeps one for the
-- crawl (HA_DUPEFILTER = "bloom"), lib/aged one per time slice (with HA_DUPEFILTER_TTL).
-- A filter is a table {L = {[0] = layer, ...}, layers = layers that exist, added = {layer ->
-- URLs this call added}, grown = a layer was made}; a layer {m, k, cap, sizes, keys, n}.
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
-- URLs.

-- BLOOM: the layout's constants (one table: a script has at most 200 locals).
--   SDS: the bytes Redis adds to a string of 64 KB .. 4 GB (header 9, terminator 1).
--   SMALL, TAIL: a remainder of a layer of at most SMALL bytes, or at most 1/TAIL of the
--   layer, is one part as it is (its rounding costs a few KB, or 0.4 % at most): few parts.
--   INV_LN2: bits per URL and per position (m / n = k / ln 2 makes half the bits set at
--   capacity); the same literal in scrapy_ha/store/bloom.py.
--   MAX_K: the most positions per URL of a first layer (1e-12 asked takes 41; 44 a time
--   slice's): a meta hash with more is none scrapy-ha wrote (scrapy_ha/store/bloom_meta.py).
local BLOOM = {SDS = 10, SMALL = 65536, TAIL = 64, INV_LN2 = 1.4426950408889634, MAX_K = 60}

-- bloom_spec(spec)
--   Returns the fields of a 'bloom ...' spec as a table, or nil when it is not one.
local function bloom_spec(spec)
  local cap, k, part, known, asked = string.match(spec or '',
    '^bloom (%d+) (%d+) (%d+) (%d+) (%S+)$')
  cap, k, part, known = tonumber(cap), tonumber(k), tonumber(part), tonumber(known)
  if not (cap and k and part and known and tonumber(asked)) or cap < 1 or k < 1
      or k > BLOOM.MAX_K or part < 1 or known > 64 then
    return nil
  end
  return {cap = cap, k = k, part = part, known = known, asked = asked}
end

-- bloom_layer(s, i)
--   Returns layer i of the filter of spec s: {m = bits, k, cap, sizes = {bytes of each part},
--   pos = the positions of the URL last probed (bloom_positions)}.
--   A remainder that is not one part as it is gets the largest part of at most its bytes
--   whose allocation is a size class (four per doubling: 2^g, 1.25, 1.5, 1.75 times 2^g).
local function bloom_layer(s, i)
  local scale = 1
  for _ = 1, i do scale = scale * 2 end
  local k = s.k + i
  local total = math.ceil(math.ceil(s.cap * scale * k * BLOOM.INV_LN2) / 8)
  local rest, sizes, m, sds = total, {}, 0, BLOOM.SDS
  while rest > 0 do
    local size = rest
    if rest >= s.part then size = s.part
    elseif rest > BLOOM.SMALL and rest * BLOOM.TAIL > total then
      local g = 1
      while g * 2 <= rest + sds do g = g * 2 end
      size = g - sds
      for j = 3, 1, -1 do
        local c = g + j * (g / 4)
        if c - sds <= rest then
          size = c - sds
          break
        end
      end
    end
    sizes[#sizes + 1] = size
    m = m + size * 8
    rest = rest - size
  end
  return {m = m, k = k, cap = s.cap * scale, sizes = sizes, pos = {}}
end

-- bloom_positions(L, fp)
--   Returns the k bit positions of the URL of fingerprint fp in layer L (its two hashes h1,
--   h2: the rule of the positions) by part: {fp = fp, parts = {[j] = {offset in part j,
--   ...}}}, j the part's index in L.keys. They are kept in L.pos, which every layer of one
--   layout shares (lib/aged's slots: a URL's positions are computed once per layer and
--   call, however many slots are read), until another fingerprint's are asked.
local function bloom_positions(L, fp)
  local pos = L.pos
  if pos.fp == fp then return pos end
  local b = {string.byte(fp, 5, 16)}
  local h1, h2 = 0, 0
  for i = 1, 6 do
    h1 = h1 * 256 + (b[i] or 0)
    h2 = h2 * 256 + (b[i + 6] or 0)
  end
  local m, sizes, parts = L.m, L.sizes, {}
  local x, y = h1 % m, h2 % m
  for i = 1, L.k do
    local j, off = 1, x
    while j < #sizes and off >= sizes[j] * 8 do
      off = off - sizes[j] * 8
      j = j + 1
    end
    local offsets = parts[j]
    if not offsets then
      offsets = {}
      parts[j] = offsets
    end
    offsets[#offsets + 1] = off
    x = x + y
    if x >= m then x = x % m end
    y = y + i
    if y >= m then y = y % m end
  end
  pos.fp, pos.parts, pos.GET, pos.SET = fp, parts, nil, nil
  return pos
end

-- bloom_probe(L, fp, write)
--   Reads (write false) or sets (write true) the k bits of the URL of fingerprint fp in
--   layer L, one BITFIELD call per part they fall in (BITFIELD's k operations are most of
--   the cost of a URL; their arguments are kept with the positions). A read first looks
--   at one bit with GETBIT: at capacity half the bits are set, so a URL the layer does not
--   hold is told half the time or more without the k operations (a check of a new URL
--   reads every slot's layers). Returns whether every one of them was set before.
local function bloom_probe(L, fp, write)
  local pos = bloom_positions(L, fp)
  if not write then -- a new URL finds its first bit clear half the time or more: one GETBIT
    local j, off = next(pos.parts)
    if redis.call('GETBIT', L.keys[j], off[1]) == 0 then return false end
  end
  local op = write and 'SET' or 'GET'
  local ops = pos[op]
  if not ops then
    ops = {}
    for j, offsets in pairs(pos.parts) do
      local a, n = {}, 0
      for _, off in ipairs(offsets) do
        a[n + 1], a[n + 2], a[n + 3] = op, 'u1', off
        n = n + 3
        if write then
          a[n + 1] = 1
          n = n + 1
        end
      end
      ops[j] = a
    end
    pos[op] = ops
  end
  local all = true
  for j, a in pairs(ops) do
    local old = redis.call(write and 'BITFIELD' or 'BITFIELD_RO', L.keys[j], unpack(a))
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

-- BLOOM.meta_bad(script, meta) (in the table: no top-level local, the script has few left)
--   Returns an error reply when the filter's meta hash holds a count no script wrote (a
--   hand edit): a layer count or a URL count that is not a whole number, a layout field
--   (capacity, k, part) that is not one from 1 (k at most MAX_K: a client that took it
--   from a BLOOMLAYOUT refusal was then told 'bad dupefilter spec'), or a rate (fp, error)
--   that is not a finite number of 0 or more; else nil. Called before the call's
--   first write: a count read as 0 made a layer again, zeroed (what it held was crawled
--   again), and one HINCRBY could not add to failed after the bits were set (the URLs
--   were then taken for seen, never stored).
function BLOOM.meta_bad(script, meta)
  local h = redis.call('HGETALL', meta)
  for i = 1, #h, 2 do
    local name, v = h[i], h[i + 1]
    local bad
    if name == 'fp' or name == 'error' then
      local x = tonumber(v)
      bad = not x or x ~= x or x < 0 or x == math.huge
    elseif name == 'capacity' or name == 'k' or name == 'part' then
      local x = string.match(v, '^%d+$') and #v <= 15 and tonumber(v)
      bad = not x or x < 1 or (name == 'k' and x > BLOOM.MAX_K)
    elseif name == 'layers' or name == 'period' or string.match(name, '^[nls]%d*:?%d*$') then
      bad = not string.match(v, '^%d+$') or #v > 18
    end
    if bad then
      return redis.error_reply('ERR ' .. script .. ': unreadable Bloom filter meta ' .. meta
        .. ': ' .. name .. ' is ' .. string.format('%q', v) .. ', not a count scrapy-ha '
        .. 'wrote (restore or delete it)')
    end
  end
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


-- bloom_insert(f, fp)
--   Adds the URL of fingerprint fp to the newest layer of filter f, once its full layers did not
--   hold it (the caller read them): a full newest layer is read, then the next one is made
--   (f.L[f.layers] must be there) and takes it. Returns true when the URL is new (it is
--   recorded now), false when its bits were all set already.
local function bloom_insert(f, fp)
  local last = f.L[f.layers - 1]
  if not last or (last.n >= last.cap and f.L[f.layers]) then -- the first, or a full one
    if last and bloom_probe(last, fp, false) then return false end
    bloom_grow(f)
  end
  local top = f.layers - 1
  local L = f.L[top]
  -- set in the newest layer: if every bit was set already, nothing changed and it is seen
  if bloom_probe(L, fp, true) then return false end
  L.n = L.n + 1
  f.added[top] = (f.added[top] or 0) + 1
  return true
end
