--- @include "time"
-- lib/counter: the counters that number entries (seq) and lease tokens (lseq).
--
-- take(counter, n)
--   KEYS: counter, a string key holding an integer (the caller's KEYS[i])
--   Reserves n numbers; returns base, so that base + 1 .. base + n are this call's.
--   Rule: a counter overwritten with garbage restarts above any number it can have given
--   (the server's unix seconds), instead of failing the script half-way.
local function take(counter, n)
  local ok, v = pcall(redis.call, 'INCRBY', counter, n)
  if ok then return v - n end
  local base = math.floor(now_ms() / 1000)
  redis.call('SET', counter, base + n)
  return base
end
