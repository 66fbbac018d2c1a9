-- feed: move start URLs from scrapy-redis's start list (or set) into the queue, atomically:
-- an entry leaves the list only in the same step that enqueues its request. Every argument
-- is checked before the first write; priorities are clamped to -4095 .. 4095.
-- KEYS[1] start URLs key  KEYS[2] pending  KEYS[3] payload  KEYS[4] dupefilter  KEYS[5] seq
-- ARGV[1] 'list' or 'set'  ARGV[2] k, the number of raw entries read
-- ARGV[3] order within a priority: 'fifo' or 'lifo'
-- ARGV[4 .. 3+k] the raw entries read (the head of the list, or set members)
-- then k triples: fingerprint ('' = never filtered), priority, payload ('' = invalid: dropped)
-- Returns the number of requests added, or -1 when the list's head changed meanwhile
-- (another worker took it first: read again).
local PRIO = 1099511627776
local k = tonumber(ARGV[2])
local lifo = ARGV[3] == 'lifo'
if not k or #ARGV ~= 3 + 4 * k or not (lifo or ARGV[3] == 'fifo') then
  return redis.error_reply('ERR feed: bad argument count or order')
end
local prios = {}
for i = 1, k do
  local p = tonumber(ARGV[3 + k + (i - 1) * 3 + 2])
  if not p then return redis.error_reply('ERR feed: priority ' .. i .. ' is not a number') end
  prios[i] = math.max(-4095, math.min(4095, p))
end
-- A key of the wrong type fails here, before any write: the entry stays where it was
-- (the worker sets the key aside and retries the call).
local TYPES = {[1] = ARGV[1] == 'list' and 'list' or 'set', [2] = 'zset', [3] = 'hash', [4] = 'set'}
for i, want in pairs(TYPES) do
  local ty = redis.call('TYPE', KEYS[i])['ok']
  if ty ~= 'none' and ty ~= want then
    return redis.error_reply('WRONGTYPE feed: ' .. KEYS[i] .. ' holds a ' .. ty)
  end
end
local take = {}
if ARGV[1] == 'list' then
  local head = redis.call('LRANGE', KEYS[1], 0, k - 1)
  if #head ~= k then return -1 end
  for i = 1, k do
    if head[i] ~= ARGV[3 + i] then return -1 end
    take[i] = true
  end
  redis.call('LTRIM', KEYS[1], k, -1)
else
  for i = 1, k do
    take[i] = redis.call('SREM', KEYS[1], ARGV[3 + i]) == 1
  end
end
local ok, top = pcall(redis.call, 'INCRBY', KEYS[5], k)
if not ok then
  top = tonumber(redis.call('TIME')[1]) + k
  redis.call('SET', KEYS[5], top)
end
local base = top - k
local added = 0
for i = 1, k do
  local a = 4 + k + (i - 1) * 3
  local fp = ARGV[a]
  if take[i] and ARGV[a + 2] ~= '' and (fp == '' or redis.call('SADD', KEYS[4], fp) == 1) then
    local seq = base + i
    local id = string.format('%.0f', seq)
    local score = -prios[i] * PRIO + (lifo and PRIO - seq or seq)
    redis.call('ZADD', KEYS[2], string.format('%.0f', score), id .. ' ' .. ARGV[a + 2])
    added = added + 1
  end
end
return added
