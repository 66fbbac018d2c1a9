-- purge: delete dead-letter entries for good (their info and payload too). With an SQL
-- archive declared for the crawl, an entry not archived yet is kept (see lib/deadletter).
-- KEYS[1] dead  KEYS[2] dead_info  KEYS[3] payload
-- KEYS[4] stats  KEYS[5] stats:min  KEYS[6] stats:domain (lib/stats)  KEYS[7] dead_archived
-- KEYS[8] revisit_urls (lib/deadletter: drop_dead takes the entry's "x:" field away)
-- ARGV entry ids
-- Returns {deleted, kept because not archived yet}.
--- @include "types"
--- @include "stats"
--- @include "deadletter"
local err = wrong_type('purge', KEYS, {'zset', 'hash', 'hash', 'hash', 'hash', 'hash', 'hash', 'hash'})
if err then return err end
local n, kept = 0, 0
for i = 1, #ARGV do
  if redis_call('ZSCORE', KEYS[1], ARGV[i]) then
    if archived(KEYS[1], KEYS[7], ARGV[i]) then
      drop_dead(KEYS[1], KEYS[2], KEYS[3], KEYS[7], KEYS[8], ARGV[i])
      n = n + 1
    else
      kept = kept + 1
    end
  end
end
count('purged', n)
write_stats(KEYS[4], KEYS[5], KEYS[6], now_ms())
return {n, kept}
