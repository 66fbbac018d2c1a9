-- purge: delete dead-letter entries for good (their info and payload too).
-- KEYS[1] dead  KEYS[2] dead_info  KEYS[3] payload
-- KEYS[4] stats  KEYS[5] stats:min  KEYS[6] stats:domain (lib/stats)
-- ARGV entry ids
-- Returns the number deleted.
--- @include "types"
--- @include "stats"
local err = wrong_type('purge', KEYS, {nil, nil, nil, 'hash', 'hash', 'hash'})
if err then return err end
local n = 0
for i = 1, #ARGV do
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    redis.call('HDEL', KEYS[2], ARGV[i])
    redis.call('HDEL', KEYS[3], ARGV[i])
    n = n + 1
  end
end
count('purged', n)
write_stats(KEYS[4], KEYS[5], KEYS[6], now_ms())
return n
