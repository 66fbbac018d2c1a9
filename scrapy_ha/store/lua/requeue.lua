-- requeue: move dead-letter entries back to pending (operator action); idempotent: an entry
-- no longer in the dead-letter queue is skipped. Every argument is checked before the first
-- write; priorities are clamped (lib/priority). A requeued entry keeps its id and goes to
-- its back queue (lib/frontier) at a new place, as a request enqueued now.
-- KEYS[1] dead  KEYS[2] dead_info  KEYS[3] the back queues' prefix (lib/frontier)
-- KEYS[4] payload  KEYS[5] seq  KEYS[6] expiries
-- KEYS[7] stats  KEYS[8] stats:min  KEYS[9] stats:domain (lib/stats)
-- KEYS[10] ready  KEYS[11] waiting  KEYS[12] queued (lib/frontier)
-- KEYS[13] revisit_alloc (lib/revisit: a revisit entry dead-lettered takes back its share
--          of the budget's sums, from its record)
-- KEYS[14] revisits (lib/revisit: a revisit entry goes back to the revisits set, due now,
--          so that it holds its URL while pending; its record says it left it)
-- KEYS[15] revisit_urls (lib/revisit: a URL a copy took from it while it was dead-lettered
--          comes back to it)
-- ARGV[1] order within a priority: 'fifo' or 'lifo'
-- then quadruples: entry id, priority, host of its URL ('-': none), payload with its
-- attempt counters reset
-- Returns the number requeued.
--- @include "priority"
--- @include "counter"
--- @include "types"
--- @include "stats"
--- @include "frontier"
--- @include "revisit"
local lifo = ARGV[1] == 'lifo'
if not (lifo or ARGV[1] == 'fifo') or (#ARGV - 1) % 4 ~= 0 then
  return redis.error_reply('ERR requeue: order, then (id, priority, host, payload) quadruples')
end
local prios = {}
for i = 2, #ARGV, 4 do
  local p = tonumber(ARGV[i + 1])
  if not (p and valid_id(ARGV[i]) and str_match(ARGV[i + 2], '^%S+$')) then
    return redis.error_reply('ERR requeue: bad entry id, priority or host in quadruple '
      .. (i + 2) / 4)
  end
  prios[i] = clamp_priority(p)
end
local err = wrong_type('requeue', KEYS,
  {'zset', 'hash', nil, 'hash', nil, 'hash', 'hash', 'hash', 'hash', 'zset', 'zset', 'string',
  'hash', 'zset', 'hash'})
if err then return err end
local now = now_ms()
frontier_open(KEYS[3], KEYS[10], KEYS[11], KEYS[12], lifo, false)
local n = 0
for i = 2, #ARGV, 4 do
  local id = ARGV[i]
  if redis_call('ZREM', KEYS[1], id) == 1 then
    local place = place_of(take(KEYS[5], 1) + 1, lifo, false)
    local ok, info = pcall(cjson.decode, redis_call('HGET', KEYS[2], id) or '')
    if ok and type(info) == 'table' then
      if type(info['revisit']) == 'table' then revisit_restore(KEYS[13], id, info['revisit']) end
      revisit_rejoin(KEYS[14], KEYS[15], id, info, now)
    end
    redis_call('HDEL', KEYS[2], id)
    redis_call('HDEL', KEYS[6], id)
    redis_call('HDEL', KEYS[4], id)
    frontier_return(queue_id(prios[i], false, ARGV[i + 2]), id, place, ARGV[i + 3])
    n = n + 1
  end
end
frontier_close()
count('requeued', n)
write_stats(KEYS[7], KEYS[8], KEYS[9], now)
return n
