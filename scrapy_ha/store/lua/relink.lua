-- relink: back queues that neither ready nor waiting names (the one that named them held
-- garbage, a key of another type, and was set aside) wait again, due now: the next lease
-- wakes them into ready, scored by their heads (lib/frontier: frontier_due). Without it,
-- their requests stayed in Redis with nothing leading to them, and the crawl ended.
-- KEYS[1] ready  KEYS[2] waiting
-- ARGV the queues' ids (their names less the back queues' prefix)
-- Returns how many were made to wait.
--- @include "time"
local now = now_ms()
local n = 0
for _, qid in ipairs(ARGV) do
  if not redis.call('ZSCORE', KEYS[1], qid) and not redis.call('ZSCORE', KEYS[2], qid) then
    redis.call('ZADD', KEYS[2], now, qid)
    n = n + 1
  end
end
return n
