-- purge: delete dead-letter entries for good (their info and payload too). With an SQL
-- archive declared for the crawl, an entry not archived yet is kept (see lib/deadletter).
-- KEYS[1] dead  KEYS[2] dead_info  KEYS[3] payload  KEYS[4] dead_archived
-- ARGV entry ids
-- Returns {deleted, kept because not archived yet}.
--- @include "deadletter"
local n, kept = 0, 0
for i = 1, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    if archived(KEYS[1], KEYS[4], ARGV[i]) then
      redis.call('ZREM', KEYS[1], ARGV[i])
      redis.call('HDEL', KEYS[2], ARGV[i])
      redis.call('HDEL', KEYS[3], ARGV[i])
      redis.call('HDEL', KEYS[4], ARGV[i])
      n = n + 1
    else
      kept = kept + 1
    end
  end
end
return {n, kept}
