-- relink: back queues that neither ready nor waiting names (the one that named them held
-- garbage, a key of another type, and was set aside) wait again, due now: the next lease
-- wakes them into ready, scored by their heads (lib/frontier: frontier_due). Without it,
-- their requests stayed in Redis with nothing leading to them, and the crawl ended.
-- KEYS[1] ready  KEYS[2] waiting  KEYS[3] the marker of a relink owed (set_aside.lua
-- counts the renames in it)
-- ARGV[1] the marker's value read before the scan of the queues' names ('' : leave it), deleted
-- only if unchanged: a rename since then owes another relink
-- ARGV[2..] the queues' ids (their names less the back queues' prefix)
-- Returns how many were made to wait.
--- @include "time"
local now = now_ms()
local n = 0
for i = 2, #ARGV do
  local qid = ARGV[i]
  if not redis.call('ZSCORE', KEYS[1], qid) and not redis.call('ZSCORE', KEYS[2], qid) then
    redis.call('ZADD', KEYS[2], now, qid)
    n = n + 1
  end
end
if ARGV[1] ~= '' and redis.call('GET', KEYS[3]) == ARGV[1] then redis.call('DEL', KEYS[3]) end
return n
