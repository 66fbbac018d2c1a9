-- feed: move start URLs from scrapy-redis's start list (or set) into the queue, atomically:
-- an entry leaves the list only in the same step that enqueues its request.
-- KEYS[1] start URLs key  KEYS[2] pending  KEYS[3] payload  KEYS[4] dupefilter  KEYS[5] seq
-- ARGV[1] 'list' or 'set'  ARGV[2] k, the number of raw entries read
-- ARGV[3 .. 2+k] the raw entries read (the head of the list, or set members)
-- then k triples: fingerprint ('' = never filtered), priority, payload ('' = invalid: dropped)
-- Returns the number of requests added, or -1 when the list's head changed meanwhile
-- (another worker took it first: read again).
local k = tonumber(ARGV[2])
local take = {}
if ARGV[1] == 'list' then
  local head = redis.call('LRANGE', KEYS[1], 0, k - 1)
  if #head ~= k then return -1 end
  for i = 1, k do
    if head[i] ~= ARGV[2 + i] then return -1 end
    take[i] = true
  end
  redis.call('LTRIM', KEYS[1], k, -1)
else
  for i = 1, k do
    take[i] = redis.call('SREM', KEYS[1], ARGV[2 + i]) == 1
  end
end
local PRIO = 1099511627776
local base = redis.call('INCRBY', KEYS[5], k) - k
local added = 0
for i = 1, k do
  local a = 3 + k + (i - 1) * 3
  local fp = ARGV[a]
  if take[i] and ARGV[a + 2] ~= '' and (fp == '' or redis.call('SADD', KEYS[4], fp) == 1) then
    local seq = base + i
    local id = string.format('%.0f', seq)
    redis.call('ZADD', KEYS[2], string.format('%.0f', -tonumber(ARGV[a + 1]) * PRIO + seq),
      id .. ' ' .. ARGV[a + 2])
    added = added + 1
  end
end
return added
