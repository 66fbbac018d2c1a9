-- dead: move one leased entry to the dead-letter queue, fenced by its lease token.
-- KEYS[1] leased  KEYS[2] leases  KEYS[3] dead  KEYS[4] dead_info  KEYS[5] expiries
-- ARGV[1] entry id  ARGV[2] lease token  ARGV[3] JSON object describing why
-- The JSON gets "last" (server time, ms) and keeps "first" if given.
-- Returns 1, or 0 when the token is stale (nothing changes).
local v = redis.call('HGET', KEYS[2], ARGV[1])
if not (v and string.match(v, '^(%S+)') == ARGV[2]) then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local info = cjson.decode(ARGV[3])
info['last'] = now
if not info['first'] then info['first'] = now end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
redis.call('ZADD', KEYS[3], now, ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], cjson.encode(info))
return 1
