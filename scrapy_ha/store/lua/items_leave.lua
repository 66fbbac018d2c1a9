-- items_leave: a consumer that ends with nothing pending leaves its group (XGROUP
-- DELCONSUMER), so that `status` counts the consumers running or owing entries, not every
-- name that ever read. Rule: lib/stream (an entry delivered to a consumer stays pending to
-- it until acknowledged): a consumer still owing entries stays, and the check and the
-- removal are one call, so entries read under its name meanwhile (another process of the
-- same name) are never dropped with it.
-- KEYS[1] the crawl's item stream
-- ARGV[1] the consumer group  ARGV[2] the consumer
-- Returns 1 when the consumer left, 0 when it owes entries (or there is no such group or
-- stream: nothing to leave)
if redis.call('TYPE', KEYS[1])['ok'] ~= 'stream' then return 0 end
local ok, owed = pcall(redis.call, 'XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if not ok or #owed > 0 then return 0 end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
