-- lib/polite: crawl-wide per-domain limits (HA_DOMAIN_RATE, HA_DOMAIN_CONCURRENCY,
-- HA_DOMAIN_LIMITS), kept where requests are leased, so that they hold for any number of
-- workers at no extra round trip.
--   limits hash: '*' -> "<rate> <concurrency>" for every domain, '<domain>' -> the same for
--          one domain (0 = no limit of that kind); written by the workers at start
--   polite hash: 'n:<domain>' -> leases of the domain holding a concurrency slot;
--          't:<domain>' -> server time (ms) before which its next request may not start;
--          'w:<domain>' -> the back queues (lib/frontier, qids separated by spaces) that
--          wait for one of the domain's slots, best first (by priority, then a start
--          queue after the other: the order of their heads, the only ways the queues of
--          one domain differ); each slot a lease's end frees wakes the first of them;
--          '<entry id>' -> domain, for each lease holding a slot (freed when the lease ends,
--          however it ends: ack, release, reclaim, retry, dead letter)
--- @include "number"
--- @include "batch"

-- RATE_HORIZON_MS: a rate-limited request is leased at most this far ahead of its time
-- (or one interval, if longer): a worker holds a second of a domain's requests, never a
-- backlog other workers could take meanwhile (half a lease at most: it is renewed anyway).
-- Further ahead, the domain's back queue waits until it may go.
local RATE_HORIZON_MS = 1000
-- SLOT_RECHECK_MS: a back queue whose domain is at its concurrency limit waits until one of
-- the domain's leases ends (that end wakes it, if it is the best of the queues waiting for
-- the slot: polite_woken), and at most this long: a wake-up missed (a slot count written by
-- hand) costs a second, never the domain's requests.
local SLOT_RECHECK_MS = 1000

-- The fields of the polite hash this call read or changed (field -> number), written once
-- by polite_write at its end: a call that leases or acks many requests of one domain reads
-- and writes the domain's count and times once.
local FIELDS = {}
-- (the other private names are fields of one table, PL: a script's main function holds at
-- most 200 locals, the libraries' included)
local PL = {}
PL.DIRTY = {}
-- The back queues this call parked for a slot (polite_wait): domain -> qids, written by
-- polite_write.
PL.WAITS = {}
-- The domains whose slots this call freed (polite_free): domain -> slots freed, for
-- polite_woken.
PL.FREED = {}

-- field_get(state, field)
--   Returns the number a field of the polite hash holds (0 when missing or garbage, 'nan',
--   'inf' and a negative number included: lib/number finite; a count or a time that is
--   garbage starts again, and is written over when the call changes it; a negative count
--   would let more requests go than the limit).
local function field_get(state, field)
  local v = FIELDS[field]
  if v == nil then
    v = math_max(finite(redis_call('HGET', state, field)) or 0, 0)
    FIELDS[field] = v
  end
  return v
end

-- field_set(field, value)
--   Sets a field of the polite hash for this call (written by polite_write).
local function field_set(field, value)
  FIELDS[field] = value
  PL.DIRTY[field] = true
end

-- PL.wait_rank(qid)
--   Returns the rank of a back queue among those of its domain waiting for a slot (lower
--   goes first): its priority, then a start queue after the other queue of that priority,
--   which is the order of their heads' scores (lib/priority: the queues of one domain
--   differ in nothing else). A qid that cannot be read ranks last.
function PL.wait_rank(qid)
  local prio, s = str_match(qid, '^(%-?%d+)(s?):')
  if not prio then return math.huge end
  return -2 * tonumber(prio) + (s == 's' and 1 or 0)
end

-- PL.waits_write(state)
--   Adds the queues of polite_wait to their domains' 'w:' fields, each once, in their order
--   (PL.wait_rank): one read and one write per domain and call, however many it parked.
function PL.waits_write(state)
  for domain, new in pairs(PL.WAITS) do
    local field = 'w:' .. domain
    local v = redis_call('HGET', state, field) or ''
    local have, adds, once = ' ' .. v .. ' ', {}, {}
    for _, qid in ipairs(new) do
      if not (once[qid] or str_find(have, ' ' .. qid .. ' ', 1, true)) then
        once[qid] = true
        adds[#adds + 1] = qid
      end
    end
    if #adds > 0 then
      local function before(a, b) return PL.wait_rank(a) < PL.wait_rank(b) end
      table.sort(adds, before)
      -- (the lease parks a domain's queues in their order: they mostly go after the others)
      local last = str_match(v, '^.* (%S+)$') or v
      if v ~= '' and before(adds[1], last) then -- a merge: every qid read
        for qid in str_gmatch(v, '%S+') do adds[#adds + 1] = qid end
        table.sort(adds, before)
        v = ''
      end
      redis_call('HSET', state, field, (v ~= '' and (v .. ' ') or '') .. table.concat(adds, ' '))
    end
  end
  PL.WAITS = {}
end

-- polite_write(state)
--   KEYS: the polite hash (the caller's KEYS[i])
--   Writes the fields this call changed (a slot count down to 0 is deleted) and the queues
--   it parked for a slot (PL.waits_write). Call it once, after the last polite_admit,
--   polite_wait or polite_free.
local function polite_write(state)
  if next(PL.WAITS) then PL.waits_write(state) end
  for f in pairs(PL.DIRTY) do
    local v = FIELDS[f]
    if v <= 0 and str_sub(f, 1, 2) == 'n:' then
      redis_call('HDEL', state, f)
    else
      redis_call('HSET', state, f, int_str(math_ceil(v)))
    end
  end
  PL.DIRTY = {}
end

-- parse_limit(value)
--   Returns {rate, conc} of a limits field; nil when it limits nothing (or is garbage: a
--   limit nobody can read is no limit, the crawl goes on).
local function parse_limit(value)
  local r, c = str_match(value or '', '^(%S+) (%S+)$')
  r, c = finite(r), finite(c)
  if not (r and c) or (r <= 0 and c < 1) then return nil end
  return {rate = r, conc = c}
end

-- polite_open(limits, state, now, lease_ms, exists)
--   KEYS: the limits and polite hashes (the caller's KEYS[i])
--   Returns the politeness of this call, or nil when no limit is in force (the caller then
--   leases as before, without a read per request). exists: the caller knows the limits
--   hash exists (not read again).
local function polite_open(limits, state, now, lease_ms, exists)
  if not exists and redis_call('EXISTS', limits) == 0 then return nil end
  return {limits = limits, state = state, now = now, lease_ms = lease_ms, cache = {},
    default = parse_limit(redis_call('HGET', limits, '*'))}
end

-- limit_of(p, domain)
--   Returns the limit of domain ({rate, conc}) or false, read once per call.
local function limit_of(p, domain)
  local lim = p.cache[domain]
  if lim == nil then
    local own = redis_call('HGET', p.limits, domain)
    if own then lim = parse_limit(own) or false else lim = p.default or false end
    p.cache[domain] = lim
  end
  return lim
end

-- polite_admit(p, id, domain)
--   Returns wait when entry id may be leased now (wait: ms before it may start, 0 for at
--   once; its slot and its time are taken), or nil, untl, slot when it may not: its back
--   queue waits until server time untl (slot true: the domain is at its concurrency limit,
--   and the end of one of its leases wakes the queue sooner, see polite_wait).
--   Rule: at most <concurrency> leases of a domain at once; request starts of a domain at
--   least 1000 / <rate> ms apart (next = max(now, next) + interval).
local function polite_admit(p, id, domain)
  local lim = domain ~= '-' and limit_of(p, domain)
  if not lim then return 0 end
  local held = 0
  if lim.conc >= 1 then
    held = field_get(p.state, 'n:' .. domain)
    if held >= lim.conc then return nil, p.now + SLOT_RECHECK_MS, true end
  end
  local wait = 0
  if lim.rate > 0 then
    local interval = 1000 / lim.rate
    local at = math_max(p.now, field_get(p.state, 't:' .. domain))
    local horizon = math_min(math_max(RATE_HORIZON_MS, interval), p.lease_ms / 2)
    if at - p.now > horizon then return nil, math_ceil(at - horizon), false end
    field_set('t:' .. domain, math_ceil(at + interval))
    wait = math_ceil(at - p.now)
  end
  if lim.conc >= 1 then
    field_set('n:' .. domain, held + 1)
    redis_call('HSET', p.state, id, domain)
  end
  return wait
end

-- polite_wait(p, domain, qid)
--   Notes that back queue qid waits for a slot of domain (written by polite_write, at its
--   place among those waiting there: the end of a lease of the domain wakes the first of
--   them, polite_woken).
local function polite_wait(p, domain, qid)
  local w = PL.WAITS[domain]
  if not w then
    w = {}
    PL.WAITS[domain] = w
  end
  w[#w + 1] = qid
end

-- polite_free(state, ids)
--   KEYS: the polite hash (the caller's KEYS[i])
--   Frees the concurrency slots the leases of the entry ids (a list) hold, if they hold
--   one (once); the counts are written by polite_write, the queues waiting for them are
--   woken by the caller (polite_woken).
local function polite_free(state, ids)
  if #ids == 0 then return end
  local domains = batched('HMGET', state, ids, 1)
  local holders = {}
  for i, domain in ipairs(domains) do
    if domain then
      holders[#holders + 1] = ids[i]
      local field = 'n:' .. domain
      field_set(field, math_max(0, field_get(state, field) - 1))
      PL.FREED[domain] = (PL.FREED[domain] or 0) + 1
    end
  end
  if #holders > 0 then batched('HDEL', state, holders, 1) end
end

-- polite_woken(state, wake)
--   KEYS: the polite hash (the caller's KEYS[i])
--   Wakes, for each domain this call freed slots of, as many of the back queues waiting
--   for one as slots freed, the first first (polite_wait's order: Scrapy's); wake(qid)
--   moves a waiting queue back to ready and returns true, or false when it does not wait
--   any more (its recheck woke it since): the next one is taken in its place. The queues
--   woken, or found not waiting, are forgotten there; the others wait for the next slot
--   freed, or their recheck (SLOT_RECHECK_MS).
--   Rule: a slot wakes one queue, not all: a domain at its limit with many priorities
--   (one back queue each) would otherwise put them all back in ready at every lease's
--   end, ahead of other hosts, and the next lease would spend its look budget parking
--   them again instead of leasing other hosts' requests. Each qid skipped is dropped for
--   good, so skipping costs a call no more than the parks that wrote them.
local function polite_woken(state, wake)
  for domain, freed in pairs(PL.FREED) do
    local field = 'w:' .. domain
    local v = redis_call('HGET', state, field)
    if v then
      local rest = ''
      for pos, qid in str_gmatch(v, '()(%S+)') do
        if freed == 0 then
          rest = str_sub(v, pos)
          break
        end
        if wake(qid) then freed = freed - 1 end
      end
      if rest == '' then
        redis_call('HDEL', state, field)
      else
        redis_call('HSET', state, field, rest)
      end
    end
  end
  PL.FREED = {}
end
