-- requeue: move dead-letter entries back to pending (operator action); idempotent: an entry
-- no longer in the dead-letter queue is skipped. Every argument is checked before the first
-- write; priorities are clamped to -4095 .. 4095.
-- KEYS[1] dead  KEYS[2] dead_info  KEYS[3] pending  KEYS[4] payload  KEYS[5] seq
-- KEYS[6] expiries
-- ARGV[1] order within a priority: 'fifo' or 'lifo'
-- then triples: entry id, priority, payload with its attempt counters reset
-- Returns the number requeued.
local PRIO = 1099511627776
local lifo = ARGV[1] == 'lifo'
if not (lifo or ARGV[1] == 'fifo') or (#ARGV - 1) % 3 ~= 0 then
  return redis.error_reply('ERR requeue: order, then (id, priority, payload) triples')
end
local prios = {}
for i = 2, #ARGV, 3 do
  local p = tonumber(ARGV[i + 1])
  if not p or ARGV[i] == '' or string.find(ARGV[i], ' ', 1, true) then
    return redis.error_reply('ERR requeue: bad entry id or priority in triple ' .. (i + 1) / 3)
  end
  prios[i] = math.max(-4095, math.min(4095, p))
end
-- A key of the wrong type fails here, before any write: the entry stays where it was
-- (the worker sets the key aside and retries the call).
local TYPES = {[1] = 'zset', [2] = 'hash', [3] = 'zset', [4] = 'hash', [6] = 'hash'}
for i, want in pairs(TYPES) do
  local ty = redis.call('TYPE', KEYS[i])['ok']
  if ty ~= 'none' and ty ~= want then
    return redis.error_reply('WRONGTYPE requeue: ' .. KEYS[i] .. ' holds a ' .. ty)
  end
end
local n = 0
for i = 2, #ARGV, 3 do
  local id = ARGV[i]
  if redis.call('ZREM', KEYS[1], id) == 1 then
    local ok, seq = pcall(redis.call, 'INCR', KEYS[5])
    if not ok then
      seq = tonumber(redis.call('TIME')[1])
      redis.call('SET', KEYS[5], seq)
    end
    local score = -prios[i] * PRIO + (lifo and PRIO - seq or seq)
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[6], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('ZADD', KEYS[3], string.format('%.0f', score), id .. ' ' .. ARGV[i + 2])
    n = n + 1
  end
end
return n
