-- sync: one round trip of a worker's main loop, in this order:
--   1. enqueue new requests (dupefilter check + push to pending),
--   2. ack finished leases (fenced by token; children of step 1 are already durable),
--   3. promote due delayed entries, then lease up to n pending entries.
-- A pending entry is one sorted-set member "<id> <payload>" (no separate payload while it
-- waits: that keeps a queued request small); leased, delayed and dead entries keep their
-- payload in the payload hash under their id.
-- KEYS[1] pending    KEYS[2] payload   KEYS[3] dupefilter  KEYS[4] seq
-- KEYS[5] leased     KEYS[6] leases    KEYS[7] expiries    KEYS[8] delayed
-- KEYS[9] delayed_sc KEYS[10] lseq     KEYS[11] gates
-- ARGV[1] number of requests to enqueue  ARGV[2] number of acks
-- ARGV[3] number of leases wanted        ARGV[4] lease length (ms)
-- ARGV[5] most delayed entries to promote
-- then ARGV[1] requests, one argument each: "<priority> <fingerprint length (2 digits)>
--   <fingerprint><payload>" (length 00 = never filtered), e.g. "-3 12<12 bytes>{...}"
-- then ARGV[2] acks, one argument each: "<entry id> <lease token>"
-- Returns {now_ms, added, acked, stale, pending, leased, delayed, n,
--          domain1, open_at1, ... (n closed domain gates; expired ones are deleted),
--          id1, token1, payload1, expiries1, ...}
--   (payload '' when the entry has no payload: the worker dead-letters it as corrupt;
--   expiries: how many of the entry's leases expired before, so the worker can run a
--   suspect alone and only the request that kills workers is counted as poison).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n_enq, n_ack, n_lease = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local PRIO = 1099511627776 -- 2^40: priority dominates, the sequence number orders FIFO

-- A counter overwritten with garbage restarts above any id it can have given (unix seconds).
local function take(counter, n)
  local ok, v = pcall(redis.call, 'INCRBY', counter, n)
  if ok then return v - n end
  redis.call('SET', counter, tonumber(t[1]) + n)
  return tonumber(t[1])
end

local added = 0
if n_enq > 0 then
  local base = take(KEYS[4], n_enq)
  for i = 0, n_enq - 1 do
    local e = ARGV[6 + i]
    local sp = string.find(e, ' ', 1, true)
    local fl = tonumber(string.sub(e, sp + 1, sp + 2))
    local fp = string.sub(e, sp + 3, sp + 2 + fl)
    if fl == 0 or redis.call('SADD', KEYS[3], fp) == 1 then
      local seq = base + i + 1
      local id = string.format('%.0f', seq)
      local score = string.format('%.0f', -tonumber(string.sub(e, 1, sp - 1)) * PRIO + seq)
      redis.call('ZADD', KEYS[1], score, id .. ' ' .. string.sub(e, sp + 3 + fl))
      added = added + 1
    end
  end
end

local acked, stale = 0, 0
local a0 = 6 + n_enq
for i = 0, n_ack - 1 do
  local id, tok = string.match(ARGV[a0 + i], '^(%S+) (%S+)$')
  local v = redis.call('HGET', KEYS[6], id)
  if v and string.match(v, '^(%S+)') == tok then
    redis.call('ZREM', KEYS[5], id)
    redis.call('HDEL', KEYS[6], id)
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[7], id)
    acked = acked + 1
  else
    stale = stale + 1
  end
end

local out = {now, added, acked, stale, 0, 0, 0, 0}
if redis.call('HLEN', KEYS[11]) > 0 then
  local gates = redis.call('HGETALL', KEYS[11])
  for i = 1, #gates, 2 do
    local open_at = tonumber(gates[i + 1])
    if not open_at or open_at <= now then
      redis.call('HDEL', KEYS[11], gates[i])
    else
      out[#out + 1] = gates[i]
      out[#out + 1] = gates[i + 1]
      out[8] = out[8] + 1
    end
  end
end
if n_lease > 0 then
  local due = redis.call('ZRANGEBYSCORE', KEYS[8], '-inf', now, 'LIMIT', 0, tonumber(ARGV[5]))
  for _, id in ipairs(due) do
    local payload = redis.call('HGET', KEYS[2], id) or ''
    redis.call('ZADD', KEYS[1], redis.call('HGET', KEYS[9], id) or '0', id .. ' ' .. payload)
    redis.call('ZREM', KEYS[8], id)
    redis.call('HDEL', KEYS[9], id)
    redis.call('HDEL', KEYS[2], id)
  end
  local items = redis.call('ZRANGE', KEYS[1], 0, n_lease - 1, 'WITHSCORES')
  local n = #items / 2
  if n > 0 then
    redis.call('ZREMRANGEBYRANK', KEYS[1], 0, n - 1)
    local tbase = take(KEYS[10], n)
    local expiry = now + tonumber(ARGV[4])
    for i = 1, n do
      local member, score = items[i * 2 - 1], items[i * 2]
      local space = string.find(member, ' ', 1, true)
      local id = space and string.sub(member, 1, space - 1) or member
      local payload = space and string.sub(member, space + 1) or ''
      local tok = string.format('%.0f', tbase + i)
      redis.call('ZADD', KEYS[5], expiry, id)
      redis.call('HSET', KEYS[6], id, tok .. ' ' .. score)
      redis.call('HSET', KEYS[2], id, payload)
      out[#out + 1] = id
      out[#out + 1] = tok
      out[#out + 1] = payload
      out[#out + 1] = tonumber(redis.call('HGET', KEYS[7], id) or '0') or 0
    end
  end
end
out[5] = redis.call('ZCARD', KEYS[1])
out[6] = redis.call('ZCARD', KEYS[5])
out[7] = redis.call('ZCARD', KEYS[8])
return out
