-- purge: delete dead-letter entries for good (their info and payload too).
-- KEYS[1] dead  KEYS[2] dead_info  KEYS[3] payload
-- ARGV entry ids
-- Returns the number deleted.
local n = 0
for i = 1, #ARGV do
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    redis.call('HDEL', KEYS[2], ARGV[i])
    redis.call('HDEL', KEYS[3], ARGV[i])
    n = n + 1
  end
end
return n
