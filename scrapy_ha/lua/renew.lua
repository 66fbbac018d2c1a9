-- renew: heartbeat of one worker and renewal of all its leases in one call.
-- KEYS[1] leased  KEYS[2] leases  KEYS[3] workers  KEYS[4] wstats (worker stats)
-- KEYS[5] (optional) the worker's grant (written by sync.lua): its pairs are renewed too,
--         so that leases of a sync whose reply the worker has not read yet do not expire
-- ARGV[1] lease length (ms)  ARGV[2] worker id  ARGV[3] heartbeat TTL (ms)
-- ARGV[4] the worker's stats, a JSON object (leases held, pages/s) stored with "at" = now
--         for `scrapy-ha workers`; those of workers whose heartbeat expired are deleted
-- then pairs: entry id, lease token
-- Returns {now_ms, renewed, stale_id1, stale_token1, ...}: a stale pair is a lease this
-- worker lost (it expired and was reclaimed, or it was acked meanwhile); the worker must not
-- process it. Grant pairs are never reported stale (the worker does not know them yet).
--- @include "time"
--- @include "lease"
local now = now_ms()
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), ARGV[2])
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)) do
  redis.call('HDEL', KEYS[4], gone)
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local stats = cjson.decode(ARGV[4])
stats['at'] = now
redis.call('HSET', KEYS[4], ARGV[2], cjson.encode(stats))
local expiry = now + tonumber(ARGV[1])
local out = {now, 0}
local done = {} -- entry id -> the tokens renewed for it
local function renew(id, tok)
  if lease_current(KEYS[2], id, tok) then
    redis.call('ZADD', KEYS[1], 'XX', expiry, id)
    out[2] = out[2] + 1
    return true
  end
  return false
end
for i = 5, #ARGV, 2 do
  local id, tok = ARGV[i], ARGV[i + 1]
  done[id] = done[id] or {}
  done[id][tok] = true
  if not renew(id, tok) then
    out[#out + 1] = id
    out[#out + 1] = tok
  end
end
if KEYS[5] and redis.call('TYPE', KEYS[5])['ok'] == 'hash' then
  local g = redis.call('HGETALL', KEYS[5])
  for i = 1, #g, 2 do
    if not (done[g[i]] and done[g[i]][g[i + 1]]) then renew(g[i], g[i + 1]) end
  end
  redis.call('PEXPIRE', KEYS[5], tonumber(ARGV[1]))
end
return out
