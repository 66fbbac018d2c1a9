-- reclaim: move expired leases back to pending (or to the dead-letter queue as poison).
-- At most one worker reclaims per interval: the guard key is taken with NX and a TTL.
-- KEYS[1] leased  KEYS[2] leases  KEYS[3] pending  KEYS[4] expiries
-- KEYS[5] dead    KEYS[6] dead_info  KEYS[7] reclaim guard  KEYS[8] payload
-- ARGV[1] worker id  ARGV[2] interval (ms)  ARGV[3] batch size  ARGV[4] expiries before poison
-- Returns {-1} when another worker holds the guard, else {now_ms, reclaimed, poison_id1, ...}.
if not redis.call('SET', KEYS[7], ARGV[1], 'NX', 'PX', tonumber(ARGV[2])) then
  return {-1}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local batch = tonumber(ARGV[3])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, batch)
local out = {now, 0}
for _, id in ipairs(ids) do
  local v = redis.call('HGET', KEYS[2], id) or ''
  local score = string.match(v, '^%S+ (%S+)$') or '0'
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  local n = redis.call('HINCRBY', KEYS[4], id, 1)
  if n >= tonumber(ARGV[4]) then
    redis.call('HDEL', KEYS[4], id)
    redis.call('ZADD', KEYS[5], now, id)
    redis.call('HSET', KEYS[6], id, cjson.encode({
      class = 'poison', expiries = n, first = now, last = now,
      reason = 'lease expired ' .. n .. ' times: its worker died or stalled while processing it'}))
    out[#out + 1] = id
  else
    redis.call('ZADD', KEYS[3], score, id .. ' ' .. (redis.call('HGET', KEYS[8], id) or ''))
    redis.call('HDEL', KEYS[8], id)
    out[2] = out[2] + 1
  end
end
if #ids >= batch then
  redis.call('DEL', KEYS[7]) -- more are waiting: let the next tick continue
end
return out
