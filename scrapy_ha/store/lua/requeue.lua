-- requeue: move dead-letter entries back to pending (operator action); idempotent: an entry
-- no longer in the dead-letter queue is skipped. Every argument is checked before the first
-- write; priorities are clamped (lib/priority).
-- KEYS[1] dead  KEYS[2] dead_info  KEYS[3] pending  KEYS[4] payload  KEYS[5] seq
-- KEYS[6] expiries  KEYS[7] stats  KEYS[8] stats:min  KEYS[9] stats:domain (lib/stats)
-- ARGV[1] order within a priority: 'fifo' or 'lifo'
-- then triples: entry id, priority, payload with its attempt counters reset
-- Returns the number requeued.
--- @include "priority"
--- @include "member"
--- @include "counter"
--- @include "types"
--- @include "stats"
local lifo = ARGV[1] == 'lifo'
if not (lifo or ARGV[1] == 'fifo') or (#ARGV - 1) % 3 ~= 0 then
  return redis.error_reply('ERR requeue: order, then (id, priority, payload) triples')
end
local prios = {}
for i = 2, #ARGV, 3 do
  local p = tonumber(ARGV[i + 1])
  if not (p and valid_id(ARGV[i])) then
    return redis.error_reply('ERR requeue: bad entry id or priority in triple ' .. (i + 1) / 3)
  end
  prios[i] = clamp_priority(p)
end
local err = wrong_type('requeue', KEYS,
  {'zset', 'hash', 'zset', 'hash', nil, 'hash', 'hash', 'hash', 'hash'})
if err then return err end
local n = 0
for i = 2, #ARGV, 3 do
  local id = ARGV[i]
  if redis.call('ZREM', KEYS[1], id) == 1 then
    local score = pending_score(prios[i], take(KEYS[5], 1) + 1, lifo)
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[6], id)
    redis.call('HDEL', KEYS[4], id)
    push_pending(KEYS[3], id, score, ARGV[i + 2])
    n = n + 1
  end
end
count('requeued', n)
write_stats(KEYS[7], KEYS[8], KEYS[9], now_ms())
return n
