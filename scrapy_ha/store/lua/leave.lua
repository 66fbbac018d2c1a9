-- leave: a worker refused after it joined (join.lua) takes its registration back, and the
-- crawl's finish record if its join deleted it: a crawl that had finished is finished
-- again, so that a worker with another shard count may still take it over.
-- KEYS[1] where the worker registered (join.lua's KEYS[3])  KEYS[2] the finish record
-- ARGV[1] worker id  ARGV[2] '1' if its join deleted a 'done' record, else '0'
-- Returns 1 if the record was written back, else 0 (another worker is registered, alive,
-- or a record is there again).
--- @include "time"
redis.call('ZREM', KEYS[1], ARGV[1])
if ARGV[2] ~= '1' or redis.call('ZCOUNT', KEYS[1], now_ms(), '+inf') > 0 then
  return 0
end
return redis.call('SET', KEYS[2], 'done', 'NX') and 1 or 0
