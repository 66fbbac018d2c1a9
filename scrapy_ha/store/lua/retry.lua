-- retry: move a leased entry to the delayed set (never both, never neither), fenced by token.
-- The retry replaces the original: same entry id, new payload (attempt counters, history).
-- With a priority, the entry comes back with that priority and its place in the order
-- (the sequence part of its score): a retry whose priority was lowered goes after fresh work.
-- KEYS[1] leased  KEYS[2] leases  KEYS[3] delayed  KEYS[4] delayed_sc  KEYS[5] payload
-- KEYS[6] retried  KEYS[7] stats  KEYS[8] stats:min  KEYS[9] stats:domain (lib/stats)
-- KEYS[10] polite (lib/polite: the lease's concurrency slot is freed)
-- KEYS[11] the back queues' prefix  KEYS[12] ready  KEYS[13] waiting  KEYS[14] queued
--          (lib/frontier: a back queue waiting for the freed slot goes back to ready)
-- KEYS[15] held (lib/held): a deferral is marked as waiting for its domain's gate
-- ARGV[1] entry id  ARGV[2] lease token  ARGV[3] delay (ms)  ARGV[4] new payload ('' = keep)
-- ARGV[5] priority ('' = keep the original's), clamped (lib/priority)
-- ARGV[6] failure class of the retry ('' = a deferral without an attempt: not a retry, not
--         counted)
-- ARGV[7] the crawl's order within a priority ('fifo' or 'lifo', then optionally that of
--         its start queue): the score of a back queue woken here follows from it
-- ARGV[8] why a deferral waits (lib/held): 'gate' (its domain's gate; also when absent or
--         ''), 'proxy' (no usable proxy) or 'dictionary' (its compaction dictionary, gone
--         from the crawl's key, to be written back): never a retry's
-- The delayed entry keeps its pending score and the host of its back queue (lib/frontier's
-- restore record), so that its promotion puts it back in its place.
-- Returns the due time (server ms), or 0 when the token is stale (nothing changes).
--- @include "time"
--- @include "types"
--- @include "lease"
--- @include "priority"
--- @include "number"
--- @include "stats"
--- @include "polite"
--- @include "frontier"
--- @include "held"
local delay, prio = tonumber(ARGV[3]), tonumber(ARGV[5] or '')
if not delay or ((ARGV[5] or '') ~= '' and not prio) then
  return redis.error_reply('ERR retry: delay and priority must be numbers')
end
local err = wrong_type('retry', KEYS,
  {'zset', 'hash', 'zset', 'hash', 'hash', 'hash', 'hash', 'hash', 'hash', 'hash', nil, 'zset',
  'zset', 'string', 'hash'})
if err then return err end
local v = lease_current(KEYS[2], ARGV[1], ARGV[2])
if not v then
  return 0
end
local score = lease_score(v) or 0
if prio then
  score = with_priority(score, clamp_priority(prio))
end
local now = now_ms()
local due = now + delay
redis_call('ZREM', KEYS[1], ARGV[1])
redis_call('HDEL', KEYS[2], ARGV[1])
polite_free(KEYS[10], {ARGV[1]})
redis_call('ZADD', KEYS[3], due, ARGV[1])
redis_call('HSET', KEYS[4], ARGV[1], restore_value(score, lease_domain(v)))
if ARGV[4] ~= '' then
  redis_call('HSET', KEYS[5], ARGV[1], ARGV[4])
end
local class = ARGV[6] or ''
if class ~= '' then
  add(KEYS[6], ARGV[1], 1)
  count('retried', 1, lease_domain(v), class)
else
  local why = ARGV[8] or ''
  if why ~= 'proxy' and why ~= 'dictionary' then why = 'gate' end
  held_mark(KEYS[15], ARGV[1], why, lease_domain(v))
end
local lifo, start_lifo = order_flags(ARGV[7])
frontier_open(KEYS[11], KEYS[12], KEYS[13], KEYS[14], lifo, start_lifo)
polite_woken(KEYS[10], frontier_wake_one)
polite_write(KEYS[10])
write_stats(KEYS[7], KEYS[8], KEYS[9], now)
return due
