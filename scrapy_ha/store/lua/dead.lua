-- dead: move one leased entry to the dead-letter queue, fenced by its lease token, and keep
-- the queue within its retention (count and age): the oldest entries are dropped for good.
-- KEYS[1] leased  KEYS[2] leases  KEYS[3] dead  KEYS[4] dead_info  KEYS[5] expiries
-- KEYS[6] payload  KEYS[7] retried
-- KEYS[8] stats  KEYS[9] stats:min  KEYS[10] stats:domain (lib/stats)
-- KEYS[11] dead_archived (retention keeps entries not archived yet)
-- KEYS[12] polite (lib/polite: the lease's concurrency slot is freed)
-- KEYS[13] the back queues' prefix  KEYS[14] ready  KEYS[15] waiting  KEYS[16] queued
--          (lib/frontier: a back queue waiting for the freed slot goes back to ready)
-- KEYS[17] revisit_alloc (lib/revisit: an adaptive revisit entry leaves the budget's sums;
--          what it held goes in its record, "revisit": [load, base], for a requeue)
-- KEYS[18] revisits (lib/revisit: a dead-lettered entry leaves the revisits set at once,
--          which status and the dashboard count as the revisited URLs; before, it stayed
--          there up to a day; its record says it was there, "revisits": true, for a requeue)
-- KEYS[19] revisit_urls (lib/deadletter: a dead letter the retention drops leaves no "x:"
--          field there)
-- ARGV[1] entry id  ARGV[2] lease token  ARGV[3] JSON object describing why
-- ARGV[4] most entries kept  ARGV[5] oldest entry kept (age, ms)  ARGV[6] new payload ('' = keep)
-- ARGV[7] the crawl's order within a priority ('fifo' or 'lifo', then optionally that of
--         its start queue): the score of a back queue woken here follows from it
-- The JSON gets "last" (server time, ms) and keeps "first" if given.
-- Returns {1, entries in the dead-letter queue}, or {0, 0} when the token is stale.
--- @include "time"
--- @include "types"
--- @include "lease"
--- @include "deadletter"
--- @include "stats"
--- @include "polite"
--- @include "frontier"
--- @include "revisit"
local max_dead, max_age = tonumber(ARGV[4]), tonumber(ARGV[5])
local ok, info = pcall(cjson.decode, ARGV[3])
if not (max_dead and max_age and ok and type(info) == 'table') then
  return redis.error_reply('ERR dead: the reason must be a JSON object, retention numbers')
end
local err = wrong_type('dead', KEYS,
  {'zset', 'hash', 'zset', 'hash', 'hash', 'hash', 'hash', 'hash', 'hash', 'hash', nil, 'hash',
  nil, 'zset', 'zset', 'string', 'hash', 'zset', 'hash'})
if err then return err end
local v = lease_current(KEYS[2], ARGV[1], ARGV[2])
if not v then
  return {0, 0}
end
local now = now_ms()
local class = type(info['class']) == 'string' and info['class'] or 'unknown'
count('dead', 1, lease_domain(v), class)
count('retry_dead', redis_call('HDEL', KEYS[7], ARGV[1]))
redis_call('ZREM', KEYS[1], ARGV[1])
redis_call('HDEL', KEYS[2], ARGV[1])
polite_free(KEYS[12], {ARGV[1]})
redis_call('HDEL', KEYS[5], ARGV[1])
info['revisit'] = revisit_release(KEYS[17], ARGV[1])
revisit_leave(KEYS[18], ARGV[1], info)
dead_letter(KEYS[3], KEYS[4], ARGV[1], info, now)
if ARGV[6] ~= '' then
  redis_call('HSET', KEYS[6], ARGV[1], ARGV[6])
end
trim_dead(KEYS[3], KEYS[4], KEYS[6], now, max_dead, max_age, KEYS[11], KEYS[19])
local lifo, start_lifo = order_flags(ARGV[7])
frontier_open(KEYS[13], KEYS[14], KEYS[15], KEYS[16], lifo, start_lifo)
polite_woken(KEYS[12], frontier_wake_one)
polite_write(KEYS[12])
write_stats(KEYS[8], KEYS[9], KEYS[10], now)
return {1, redis_call('ZCARD', KEYS[3])}
