-- lib/polite: crawl-wide per-domain limits (HA_DOMAIN_RATE, HA_DOMAIN_CONCURRENCY,
-- HA_DOMAIN_LIMITS), kept where requests are leased, so that they hold for any number of
-- workers at no extra round trip.
--   limits hash: '*' -> "<rate> <concurrency>" for every domain, '<domain>' -> the same for
--          one domain (0 = no limit of that kind); written by the workers at start
--   polite hash: 'n:<domain>' -> leases of the domain holding a concurrency slot;
--          't:<domain>' -> server time (ms) before which its next request may not start;
--          'p:<domain>' -> the earliest time (ms) its next held-back request comes back;
--          '<entry id>' -> domain, for each lease holding a slot (freed when the lease ends,
--          however it ends: ack, release, reclaim, retry, dead letter)
--- @include "number"

-- RATE_HORIZON_MS: a rate-limited request is leased at most this far ahead of its time
-- (or one interval, if longer): a worker holds a second of a domain's requests, never a
-- backlog other workers could take meanwhile (half a lease at most: it is renewed anyway).
local RATE_HORIZON_MS = 1000
-- PARK_MS: a request of a domain at its concurrency limit waits in the delayed set at least
-- this long before it is looked at again: short against a download, and a full domain costs
-- a few scans a second. Held-back requests of one domain come back spaced (PARK_MS per slot,
-- or the rate's interval if longer), as fast as the domain could take them, so a domain
-- with thousands of requests never fills the head of the queue and starves the others.
local PARK_MS = 100

-- The fields of the polite hash this call read or changed (field -> number), written once
-- by polite_write at its end: a call that leases or acks many requests of one domain reads
-- and writes the domain's count and times once.
local FIELDS, DIRTY = {}, {}

-- field_get(state, field)
--   Returns the number a field of the polite hash holds (0 when missing or garbage).
local function field_get(state, field)
  local v = FIELDS[field]
  if v == nil then
    v = tonumber(redis.call('HGET', state, field) or '') or 0
    FIELDS[field] = v
  end
  return v
end

-- field_set(field, value)
--   Sets a field of the polite hash for this call (written by polite_write).
local function field_set(field, value)
  FIELDS[field] = value
  DIRTY[field] = true
end

-- polite_write(state)
--   KEYS: the polite hash (the caller's KEYS[i])
--   Writes the fields this call changed (a slot count down to 0 is deleted). Call it once,
--   after the last polite_admit or polite_free.
local function polite_write(state)
  for f in pairs(DIRTY) do
    local v = FIELDS[f]
    if v <= 0 and string.sub(f, 1, 2) == 'n:' then
      redis.call('HDEL', state, f)
    else
      redis.call('HSET', state, f, int_str(math.ceil(v)))
    end
  end
  DIRTY = {}
end

-- parse_limit(value)
--   Returns {rate, conc} of a limits field; nil when it limits nothing (or is garbage: a
--   limit nobody can read is no limit, the crawl goes on).
local function parse_limit(value)
  local r, c = string.match(value or '', '^(%S+) (%S+)$')
  r, c = tonumber(r), tonumber(c)
  if not (r and c) or (r <= 0 and c < 1) then return nil end
  return {rate = r, conc = c}
end

-- polite_open(limits, state, now, lease_ms)
--   KEYS: the limits and polite hashes (the caller's KEYS[i])
--   Returns the politeness of this call, or nil when no limit is in force (the caller then
--   leases as before, without a read per request).
local function polite_open(limits, state, now, lease_ms)
  if redis.call('EXISTS', limits) == 0 then return nil end
  return {limits = limits, state = state, now = now, lease_ms = lease_ms, cache = {},
    default = parse_limit(redis.call('HGET', limits, '*'))}
end

-- limit_of(p, domain)
--   Returns the limit of domain ({rate, conc}) or false, read once per call.
local function limit_of(p, domain)
  local lim = p.cache[domain]
  if lim == nil then
    local own = redis.call('HGET', p.limits, domain)
    if own then lim = parse_limit(own) or false else lim = p.default or false end
    p.cache[domain] = lim
  end
  return lim
end

-- park_due(p, domain, lim, earliest)
--   Returns the time a held-back request of domain comes back: not before earliest, and
--   spaced after the one held back before it.
local function park_due(p, domain, lim, earliest)
  local spacing = 0
  if lim.rate > 0 then spacing = 1000 / lim.rate end
  if lim.conc >= 1 then spacing = math.max(spacing, PARK_MS / lim.conc) end
  local field = 'p:' .. domain
  local due = math.ceil(math.max(earliest, field_get(p.state, field)))
  field_set(field, math.ceil(due + spacing))
  return due
end

-- polite_admit(p, id, domain)
--   Returns wait, nil when entry id may be leased now (wait: ms before it may start, 0 for
--   at once; its slot and its time are taken), or nil, due when it must wait (due: server
--   ms to look at it again).
--   Rule: at most <concurrency> leases of a domain at once; request starts of a domain at
--   least 1000 / <rate> ms apart (next = max(now, next) + interval).
local function polite_admit(p, id, domain)
  local lim = domain ~= '-' and limit_of(p, domain)
  if not lim then return 0, nil end
  local held = 0
  if lim.conc >= 1 then
    held = field_get(p.state, 'n:' .. domain)
    if held >= lim.conc then return nil, park_due(p, domain, lim, p.now + PARK_MS) end
  end
  local wait = 0
  if lim.rate > 0 then
    local interval = 1000 / lim.rate
    local at = math.max(p.now, field_get(p.state, 't:' .. domain))
    local horizon = math.min(math.max(RATE_HORIZON_MS, interval), p.lease_ms / 2)
    if at - p.now > horizon then return nil, park_due(p, domain, lim, at - horizon) end
    field_set('t:' .. domain, math.ceil(at + interval))
    wait = math.ceil(at - p.now)
  end
  if lim.conc >= 1 then
    field_set('n:' .. domain, held + 1)
    redis.call('HSET', p.state, id, domain)
  end
  return wait, nil
end

-- polite_free(state, id)
--   KEYS: the polite hash (the caller's KEYS[i])
--   Frees the concurrency slot the lease of entry id holds, if it holds one (once); the
--   count is written by polite_write.
local function polite_free(state, id)
  local domain = redis.call('HGET', state, id)
  if not domain then return end
  redis.call('HDEL', state, id)
  local field = 'n:' .. domain
  field_set(field, math.max(0, field_get(state, field) - 1))
end
