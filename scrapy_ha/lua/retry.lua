-- retry: move a leased entry to the delayed set (never both, never neither), fenced by token.
-- The retry replaces the original: same entry id, new payload (attempt counters, history).
-- KEYS[1] leased  KEYS[2] leases  KEYS[3] delayed  KEYS[4] delayed_sc  KEYS[5] payload
-- ARGV[1] entry id  ARGV[2] lease token  ARGV[3] delay (ms)  ARGV[4] new payload ('' = keep)
-- Returns the due time (server ms), or 0 when the token is stale (nothing changes).
local v = redis.call('HGET', KEYS[2], ARGV[1])
if not (v and string.match(v, '^(%S+)') == ARGV[2]) then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = now + tonumber(ARGV[3])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], due, ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], string.match(v, '^%S+ (%S+)$'))
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[5], ARGV[1], ARGV[4])
end
return due
