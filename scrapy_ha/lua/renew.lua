-- renew: heartbeat of one worker and renewal of all its leases in one call.
-- KEYS[1] leased  KEYS[2] leases  KEYS[3] workers
-- ARGV[1] lease length (ms)  ARGV[2] worker id  ARGV[3] heartbeat TTL (ms)
-- then pairs: entry id, lease token
-- Returns {now_ms, renewed, stale_id1, stale_id2, ...}: a stale id is a lease this worker
-- lost (it expired and was reclaimed); the worker must not process it.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local expiry = now + tonumber(ARGV[1])
local out = {now, 0}
for i = 4, #ARGV, 2 do
  local id, tok = ARGV[i], ARGV[i + 1]
  local v = redis.call('HGET', KEYS[2], id)
  if v and string.match(v, '^(%S+)') == tok then
    redis.call('ZADD', KEYS[1], 'XX', expiry, id)
    out[2] = out[2] + 1
  else
    out[#out + 1] = id
  end
end
return out
