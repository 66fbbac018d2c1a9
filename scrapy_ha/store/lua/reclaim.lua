-- reclaim: move expired leases back to pending (or to the dead-letter queue as poison).
-- Only the expiry of a lease whose request had been handed to the worker's engine (its
-- record marked so by renew.lua) counts toward poison: a worker that dies with leases
-- still in its buffer makes none of them suspect of killing it. Every expiry is counted
-- in the entry's "all" count (lib/lease), which the worker reads to run a suspect alone.
-- At most one worker reclaims per interval: the guard key is taken with NX and a TTL.
-- Garbage never stops it half-way: an entry whose lease record cannot be read (no record,
-- or a restore score that is not a number) is set aside in the dead-letter queue as
-- 'corrupt' with its payload, and the dead-letter queue is kept within its retention
-- (count and age) on this path too. A reclaimed entry goes back to its place in its back
-- queue (lib/frontier: the host its lease record keeps, the priority of its score).
-- KEYS[1] leased  KEYS[2] leases  KEYS[3] the back queues' prefix (lib/frontier)
-- KEYS[4] expiries  KEYS[5] dead    KEYS[6] dead_info  KEYS[7] reclaim guard  KEYS[8] payload
-- KEYS[9] retried KEYS[10] stats  KEYS[11] stats:min  KEYS[12] stats:domain (lib/stats)
-- KEYS[13] dead_archived (retention keeps entries not archived yet)
-- KEYS[14] polite (lib/polite: a reclaimed lease frees its domain's concurrency slot, so
--          a dead worker's slots come back with its leases)
-- KEYS[15] ready  KEYS[16] waiting  KEYS[17] queued (lib/frontier)
-- KEYS[18] revisits: an entry dead-lettered (poison, corrupt) leaves the revisits set at
--          once, as in dead.lua (lib/revisit: it no longer holds its URL; before, it stayed
--          there up to a day, counted by status and the dashboard as a revisited URL)
-- KEYS[19] revisit_alloc (lib/revisit: an adaptive revisit entry dead-lettered here leaves
--          the budget's sums, as in dead.lua; what it held goes in its record, "revisit":
--          [load, base], for a requeue. Before, the sums kept it: counted twice once a copy
--          of its URL claimed it, and for ever if its dead letter was purged)
-- KEYS[20] revisit_urls (lib/deadletter: a dead letter the retention drops leaves no "x:"
--          field there)
-- KEYS[21] delayed: an entry timed past any time a worker sets is due now (below)
-- ARGV[1] worker id  ARGV[2] interval (ms)  ARGV[3] batch size  ARGV[4] expiries before poison
-- ARGV[5] most dead-letter entries kept  ARGV[6] oldest dead-letter entry kept (age, ms)
-- ARGV[7] the crawl's order within a priority: 'fifo' or 'lifo', then optionally ' fifo' or
--         ' lifo' for its start queue (the places of the back queues' elements follow from it)
-- Returns {-1} when another worker holds the guard, else
-- {now_ms, reclaimed, set_aside, poison_id1, ...}.
--- @include "time"
--- @include "types"
--- @include "lease"
--- @include "deadletter"
--- @include "stats"
--- @include "polite"
--- @include "frontier"
--- @include "revisit"
local interval, batch, max_exp = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local max_dead, max_age = tonumber(ARGV[5]), tonumber(ARGV[6])
local lifo, start_lifo = order_flags(ARGV[7])
if not (interval and batch and max_exp and max_dead and max_age) or lifo == nil then
  return redis.error_reply('ERR reclaim: interval, batch, expiries and retention must be '
    .. 'numbers, then the order')
end
local err = wrong_type('reclaim', KEYS, {'zset', 'hash', nil, 'hash', 'zset', 'hash', nil,
  'hash', 'hash', 'hash', 'hash', 'hash', nil, 'hash', 'zset', 'zset', 'string', 'zset', 'hash',
  'hash', 'zset'})
if err then return err end
if not redis_call('SET', KEYS[7], ARGV[1], 'NX', 'PX', interval) then
  return {-1}
end
frontier_open(KEYS[3], KEYS[15], KEYS[16], KEYS[17], lifo, start_lifo)
local now = now_ms()
-- Rule: a time further ahead than any a worker sets (written by hand, or +inf) is garbage:
-- a lease so timed never expired and a delayed entry never came due, so the crawl never
-- ended; the lease expires now, the entry is due now. A lease lasts at most 1e12 ms
-- (HA_LEASE_TIME's longest), a delayed entry waits at most 1e13 (a revisit's interval,
-- HA_REVISIT's longest: 1e10 s; 1e12 s before 2026-12-06), so 1e12 and 1e16 ms ahead.
for key, ahead in pairs({[KEYS[1]] = 1e12, [KEYS[21]] = 1e16}) do
  local far = redis_call('ZRANGEBYSCORE', key, '(' .. int_str(now + ahead), '+inf', 'LIMIT',
    0, batch)
  for _, id in ipairs(far) do redis_call('ZADD', key, now, id) end
end
local ids = redis_call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, batch)
local out = {now, 0, 0}

-- set_dead(id, info, v, now): dead-letters entry id (lease record v) as dead.lua does: it
-- leaves the revisits set and, revisited adaptively, the budget's sums (kept in its record)
local function set_dead(id, info, v, now)
  info['revisit'] = revisit_release(KEYS[19], id)
  revisit_leave(KEYS[18], id, info)
  dead_letter(KEYS[5], KEYS[6], id, info, now)
  count('dead', 1, lease_domain(v), info['class'])
  count('retry_dead', redis_call('HDEL', KEYS[9], id))
end

for _, id in ipairs(ids) do
  local v = redis_call('HGET', KEYS[2], id) or ''
  local score = lease_score(v)
  redis_call('ZREM', KEYS[1], id)
  redis_call('HDEL', KEYS[2], id)
  polite_free(KEYS[14], {id})
  if not score then
    redis_call('HDEL', KEYS[4], id)
    local reason = 'corrupt queue entry: its lease record ' ..
      str_format('%q', str_sub(v, 1, 60)) .. ' cannot be read'
    set_dead(id, {class = 'corrupt', reason = reason}, v, now)
    out[3] = out[3] + 1
  else
    local counted, all = expiry_counts(redis_call('HGET', KEYS[4], id))
    local n = counted + (lease_handed(v) and 1 or 0)
    redis_call('HSET', KEYS[4], id, expiry_value(n, all + 1))
    if n >= max_exp then
      redis_call('HDEL', KEYS[4], id)
      local reason = 'lease expired ' .. n ..
        ' times while its request was running: its worker died or stalled processing it'
      count('poison', 1)
      set_dead(id, {class = 'poison', expiries = n, reason = reason}, v, now)
      out[#out + 1] = id
    else
      local qid, place = queue_of(score, lease_domain(v))
      frontier_return(qid, id, place, redis_call('HGET', KEYS[8], id) or '')
      redis_call('HDEL', KEYS[8], id)
      count('reclaimed', 1)
      out[2] = out[2] + 1
    end
  end
end

-- retention of the dead-letter queue, when this call dead-lettered some
if #out > 3 or out[3] > 0 then
  trim_dead(KEYS[5], KEYS[6], KEYS[8], now, max_dead, max_age, KEYS[13], KEYS[20])
end
if #ids >= batch then
  redis_call('DEL', KEYS[7]) -- more are waiting: let the next tick continue
end
polite_woken(KEYS[14], frontier_wake_one)
polite_write(KEYS[14])
frontier_close()
write_stats(KEYS[10], KEYS[11], KEYS[12], now)
return out
