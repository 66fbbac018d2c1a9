-- renew: heartbeat of one worker and renewal of all its leases in one call.
-- KEYS[1] leased  KEYS[2] leases  KEYS[3] workers  KEYS[4] wstats (worker stats)
-- KEYS[5] seen (lib/lately): worker id -> its last heartbeat, for `scrapy-ha report`
-- KEYS[6] (optional) the worker's grant (written by sync.lua): its pairs are renewed too,
--         so that leases of a sync whose reply the worker has not read yet do not expire
--         (its field '=' names the call that wrote it, not a lease)
-- ARGV[1] lease length (ms)  ARGV[2] worker id  ARGV[3] heartbeat TTL (ms)
-- ARGV[4] how many of the pairs that follow (the first ones) name requests the worker has
--         handed to its engine: their lease records are marked so (lib/lease), and only
--         the expiry of a lease so marked counts toward poison (see reclaim.lua)
-- ARGV[5] the worker's stats, a JSON object (leases held, pages/s), stored as "<now> <JSON>"
--         for `scrapy-ha workers`; those of workers whose heartbeat expired are deleted
-- then pairs: entry id, lease token
-- Returns {now_ms, renewed, workers, stale_id1, stale_token1, ...}: workers is the number of
-- live workers, this one included (a worker alone keeps its new requests: _keep.py); a stale
-- pair is a lease this worker lost (it expired and was reclaimed, or it was acked meanwhile);
-- the worker must not process it. Grant pairs are never reported stale (the worker does not
-- know them yet).
--- @include "time"
--- @include "lease"
--- @include "number"
--- @include "types"
--- @include "lately"
local lease_ms, heartbeat_ms, n_handed = tonumber(ARGV[1]), tonumber(ARGV[3]), tonumber(ARGV[4])
if not (lease_ms and heartbeat_ms and n_handed) or #ARGV % 2 ~= 1 then
  return redis.error_reply('ERR renew: bad arguments (lease and heartbeat ms, the count of '
    .. 'handed pairs, the stats, then pairs)')
end
local err = wrong_type('renew', KEYS, {'zset', 'hash', 'zset', 'hash', 'zset'})
if err then return err end
local now = now_ms()
-- (a heartbeat further ahead than any TTL, at most 1e12 ms: written by hand, or +inf, is
-- a worker that never expired: flush refused, finishing workers waited for it; gone too)
local function drop_workers(lo, hi)
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], lo, hi)) do
    redis.call('HDEL', KEYS[4], gone)
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[3], lo, hi)
end
-- the first write is one that cannot grow memory: Redis over its maxmemory then runs the
-- rest (it refuses a script whose first write may grow memory, and the renewals of live
-- workers failed while it was full: their leases expired, their pages were done twice)
drop_workers('-inf', now)
drop_workers('(' .. int_str(now + 1e12), '+inf')
redis.call('ZADD', KEYS[3], now + heartbeat_ms, ARGV[2])
seen_mark(KEYS[5], ARGV[2], now)
redis.call('HSET', KEYS[4], ARGV[2], table.concat({int_str(now), ARGV[5]}, ' '))
local expiry = now + lease_ms
local out = {now, 0, redis.call('ZCARD', KEYS[3])}
local done = {} -- entry id -> the tokens renewed for it
local function renew(id, tok, handed)
  local record = lease_current(KEYS[2], id, tok)
  if record then
    redis.call('ZADD', KEYS[1], 'XX', expiry, id)
    if handed and not lease_handed(record) then
      redis.call('HSET', KEYS[2], id, lease_mark_handed(record))
    end
    out[2] = out[2] + 1
    return true
  end
  return false
end
for i = 6, #ARGV, 2 do
  local id, tok = ARGV[i], ARGV[i + 1]
  done[id] = done[id] or {}
  done[id][tok] = true
  if not renew(id, tok, i < 6 + 2 * n_handed) then
    out[#out + 1] = id
    out[#out + 1] = tok
  end
end
if KEYS[6] and redis.call('TYPE', KEYS[6])['ok'] == 'hash' then
  local g = redis.call('HGETALL', KEYS[6])
  for i = 1, #g, 2 do
    local id, tok = g[i], g[i + 1]
    if id ~= '=' and not (done[id] and done[id][tok]) then renew(id, tok) end
  end
  redis.call('PEXPIRE', KEYS[6], lease_ms)
end
return out
