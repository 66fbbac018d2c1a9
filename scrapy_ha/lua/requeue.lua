-- requeue: move dead-letter entries back to pending (operator action); idempotent: an entry
-- no longer in the dead-letter queue is skipped.
-- KEYS[1] dead  KEYS[2] dead_info  KEYS[3] pending  KEYS[4] payload  KEYS[5] seq
-- KEYS[6] expiries
-- ARGV triples: entry id, priority, payload with its attempt counters reset
-- Returns the number requeued.
local PRIO = 1099511627776
local n = 0
for i = 1, #ARGV, 3 do
  local id = ARGV[i]
  if redis.call('ZREM', KEYS[1], id) == 1 then
    local seq = redis.call('INCR', KEYS[5])
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[6], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('ZADD', KEYS[3], string.format('%.0f', -tonumber(ARGV[i + 1]) * PRIO + seq),
      id .. ' ' .. ARGV[i + 2])
    n = n + 1
  end
end
return n
