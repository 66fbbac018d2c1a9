-- feed: move start URLs from scrapy-redis's start list (or set) into the queue, atomically:
-- an entry leaves the list only in the same step that enqueues its request. Every argument
-- is checked before the first write; priorities are clamped (lib/priority).
-- KEYS[1] start URLs key  KEYS[2] the back queues' prefix (lib/frontier)  KEYS[3] payload
-- KEYS[4] dupefilter (lib/seen)  KEYS[5] seq
-- KEYS[6] stats  KEYS[7] stats:min  KEYS[8] stats:domain (lib/stats)
-- KEYS[9] ready  KEYS[10] waiting  KEYS[11] queued (lib/frontier)
-- then the bitmaps of the dupefilter, when it is a Bloom filter (lib/seen)
-- ARGV[1] 'list' or 'set'  ARGV[2] k, the number of raw entries read
-- ARGV[3] order within a priority: 'fifo' or 'lifo'
-- ARGV[4 .. 3+k] the raw entries read (the head of the list, or set members)
-- then k quadruples: fingerprint ('' = never filtered), priority, host of the URL ('-':
-- none), payload ('' = invalid: dropped)
-- then the dupefilter's spec: 'set', 'set <ttl ms>' or 'bloom ...' (lib/seen)
-- Returns the number of requests added, or -1 when the list's head changed meanwhile
-- (another worker took it first: read again).
--- @include "priority"
--- @include "counter"
--- @include "types"
--- @include "stats"
--- @include "frontier"
--- @include "seen"
local k = tonumber(ARGV[2])
local lifo = ARGV[3] == 'lifo'
if not k or #ARGV ~= 4 + 5 * k or not (lifo or ARGV[3] == 'fifo') then
  return redis.error_reply('ERR feed: bad argument count or order')
end
local prios = {}
for i = 1, k do
  local p = tonumber(ARGV[3 + k + (i - 1) * 4 + 2])
  local host = ARGV[3 + k + (i - 1) * 4 + 3]
  if not p then return redis.error_reply('ERR feed: priority ' .. i .. ' is not a number') end
  if not str_match(host, '^%S+$') then
    return redis.error_reply('ERR feed: host ' .. i .. ' is empty or has a space')
  end
  prios[i] = clamp_priority(p)
end
local err = wrong_type('feed', KEYS, {ARGV[1] == 'list' and 'list' or 'set', nil, 'hash', nil,
  nil, 'hash', 'hash', 'hash', 'zset', 'zset', 'string'})
if err then return err end
local seen
seen, err = seen_open('feed', KEYS[4], ARGV[#ARGV], KEYS, now_ms())
if err then return err end
local taken = {}
if ARGV[1] == 'list' then
  local head = redis_call('LRANGE', KEYS[1], 0, k - 1)
  if #head ~= k then return -1 end
  for i = 1, k do
    if head[i] ~= ARGV[3 + i] then return -1 end
    taken[i] = true
  end
  redis_call('LTRIM', KEYS[1], k, -1)
else
  for i = 1, k do
    taken[i] = redis_call('SREM', KEYS[1], ARGV[3 + i]) == 1
  end
end
frontier_open(KEYS[2], KEYS[9], KEYS[10], KEYS[11], lifo, false)
local base = take(KEYS[5], k)
local added = 0
for i = 1, k do
  local a = 4 + k + (i - 1) * 4
  local fp, host, payload = ARGV[a], ARGV[a + 2], ARGV[a + 3]
  if taken[i] and payload ~= '' then
    if fp == '' or seen_add(seen, fp) then
      frontier_push(queue_id(prios[i], false, host), prios[i], false, int_str(base + i), payload)
      added = added + 1
      count('enqueued', 1, host)
    else
      count('start_duplicates', 1) -- a start URL the crawl had queued already
    end
  end
end
frontier_write()
frontier_close()
seen_close(seen)
write_stats(KEYS[6], KEYS[7], KEYS[8], now_ms())
return added
