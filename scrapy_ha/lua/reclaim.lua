-- reclaim: move expired leases back to pending (or to the dead-letter queue as poison).
-- At most one worker reclaims per interval: the guard key is taken with NX and a TTL.
-- Garbage never stops it half-way: an entry whose lease record cannot be read (no record,
-- or a restore score that is not a number) is set aside in the dead-letter queue as
-- 'corrupt' with its payload, and the dead-letter queue is kept within its retention
-- (count and age) on this path too.
-- KEYS[1] leased  KEYS[2] leases  KEYS[3] pending  KEYS[4] expiries
-- KEYS[5] dead    KEYS[6] dead_info  KEYS[7] reclaim guard  KEYS[8] payload
-- ARGV[1] worker id  ARGV[2] interval (ms)  ARGV[3] batch size  ARGV[4] expiries before poison
-- ARGV[5] most dead-letter entries kept  ARGV[6] oldest dead-letter entry kept (age, ms)
-- Returns {-1} when another worker holds the guard, else
-- {now_ms, reclaimed, set_aside, poison_id1, ...}.
local interval, batch, max_exp = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local max_dead, max_age = tonumber(ARGV[5]), tonumber(ARGV[6])
if not (interval and batch and max_exp and max_dead and max_age) then
  return redis.error_reply('ERR reclaim: interval, batch, expiries and retention must be numbers')
end
-- A key of the wrong type fails here, before any write: the entry stays where it was
-- (the worker sets the key aside and retries the call).
local TYPES = {[1] = 'zset', [2] = 'hash', [3] = 'zset', [4] = 'hash', [5] = 'zset', [6] = 'hash', [8] = 'hash'}
for i, want in pairs(TYPES) do
  local ty = redis.call('TYPE', KEYS[i])['ok']
  if ty ~= 'none' and ty ~= want then
    return redis.error_reply('WRONGTYPE reclaim: ' .. KEYS[i] .. ' holds a ' .. ty)
  end
end
if not redis.call('SET', KEYS[7], ARGV[1], 'NX', 'PX', interval) then
  return {-1}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, batch)
local out = {now, 0, 0}

local function dead(id, info)
  info['first'], info['last'] = now, now
  redis.call('ZADD', KEYS[5], now, id)
  redis.call('HSET', KEYS[6], id, cjson.encode(info))
end

for _, id in ipairs(ids) do
  local v = redis.call('HGET', KEYS[2], id) or ''
  local score = tonumber(string.match(v, '^%S+ (%S+)') or '')
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  if not score then
    redis.call('HDEL', KEYS[4], id)
    dead(id, {class = 'corrupt', reason = 'corrupt queue entry: its lease record ' ..
      string.format('%q', string.sub(v, 1, 60)) .. ' cannot be read'})
    out[3] = out[3] + 1
  else
    local n = (tonumber(redis.call('HGET', KEYS[4], id) or '0') or 0) + 1
    redis.call('HSET', KEYS[4], id, n) -- (a count overwritten with garbage starts again)
    if n >= max_exp then
      redis.call('HDEL', KEYS[4], id)
      dead(id, {class = 'poison', expiries = n,
        reason = 'lease expired ' .. n .. ' times: its worker died or stalled while processing it'})
      out[#out + 1] = id
    else
      redis.call('ZADD', KEYS[3], string.format('%.0f', score),
        id .. ' ' .. (redis.call('HGET', KEYS[8], id) or ''))
      redis.call('HDEL', KEYS[8], id)
      out[2] = out[2] + 1
    end
  end
end

-- retention of the dead-letter queue (as in dead.lua): the oldest entries go for good
if #out > 3 or out[3] > 0 then
  local old = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now - max_age, 'LIMIT', 0, 100)
  local excess = redis.call('ZCARD', KEYS[5]) - #old - max_dead
  if excess > 0 then
    local more = redis.call('ZRANGE', KEYS[5], #old, #old + math.min(excess, 100) - 1)
    for _, id in ipairs(more) do old[#old + 1] = id end
  end
  for _, id in ipairs(old) do
    redis.call('ZREM', KEYS[5], id)
    redis.call('HDEL', KEYS[6], id)
    redis.call('HDEL', KEYS[8], id)
  end
end
if #ids >= batch then
  redis.call('DEL', KEYS[7]) -- more are waiting: let the next tick continue
end
return out
