-- dead: move one leased entry to the dead-letter queue, fenced by its lease token, and keep
-- the queue within its retention (count and age): the oldest entries are dropped for good.
-- KEYS[1] leased  KEYS[2] leases  KEYS[3] dead  KEYS[4] dead_info  KEYS[5] expiries
-- KEYS[6] payload
-- ARGV[1] entry id  ARGV[2] lease token  ARGV[3] JSON object describing why
-- ARGV[4] most entries kept  ARGV[5] oldest entry kept (age, ms)  ARGV[6] new payload ('' = keep)
-- The JSON gets "last" (server time, ms) and keeps "first" if given.
-- Returns {1, entries in the dead-letter queue}, or {0, 0} when the token is stale.
local max_dead, max_age = tonumber(ARGV[4]), tonumber(ARGV[5])
local ok, info = pcall(cjson.decode, ARGV[3])
if not (max_dead and max_age and ok and type(info) == 'table') then
  return redis.error_reply('ERR dead: the reason must be a JSON object, retention numbers')
end
-- A key of the wrong type fails here, before any write: the entry stays where it was
-- (the worker sets the key aside and retries the call).
local TYPES = {[1] = 'zset', [2] = 'hash', [3] = 'zset', [4] = 'hash', [5] = 'hash', [6] = 'hash'}
for i, want in pairs(TYPES) do
  local ty = redis.call('TYPE', KEYS[i])['ok']
  if ty ~= 'none' and ty ~= want then
    return redis.error_reply('WRONGTYPE dead: ' .. KEYS[i] .. ' holds a ' .. ty)
  end
end
local v = redis.call('HGET', KEYS[2], ARGV[1])
if not (v and string.match(v, '^(%S+)') == ARGV[2]) then
  return {0, 0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
info['last'] = now
if not info['first'] then info['first'] = now end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
redis.call('ZADD', KEYS[3], now, ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], cjson.encode(info))
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[6], ARGV[1], ARGV[6])
end
local old = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - max_age, 'LIMIT', 0, 100)
local excess = redis.call('ZCARD', KEYS[3]) - #old - max_dead
if excess > 0 then
  local more = redis.call('ZRANGE', KEYS[3], #old, #old + math.min(excess, 100) - 1)
  for _, id in ipairs(more) do old[#old + 1] = id end
end
for _, id in ipairs(old) do
  redis.call('ZREM', KEYS[3], id)
  redis.call('HDEL', KEYS[4], id)
  redis.call('HDEL', KEYS[6], id)
end
return {1, redis.call('ZCARD', KEYS[3])}
