-- gate: close a domain for every worker until a time (never shortens an existing gate).
-- KEYS[1] gates  KEYS[2] gate log (optional; sorted set): domain -> the number of its gate's
--   last change, '=' -> the last number given; a sync returns the gates changed since the
--   number its worker last saw (sync.lua), not every gate at every call
-- ARGV[1] domain  ARGV[2] how long (ms)
-- Returns the time (server ms) the domain opens again.
--- @include "time"
--- @include "number"
-- SWEEP: the log's oldest entries looked at per close, their expired gates deleted (a sync
-- never deletes one): the hash and the log stay about the size of the gates closed now.
local SWEEP = 16
local now = now_ms()
local untl = now + tonumber(ARGV[2])
local old = finite(redis_call('HGET', KEYS[1], ARGV[1])) or 0 -- garbage: written over
if old > untl then
  return old
end
redis_call('HSET', KEYS[1], ARGV[1], int_str(untl))
-- (a log of another type is left to the next sync, which has it set aside: the gate holds)
if KEYS[2] and redis_call('TYPE', KEYS[2])['ok'] ~= 'zset' and redis_call('EXISTS', KEYS[2]) == 1 then
  return untl
end
if KEYS[2] then
  -- numbers are at least the server's time in µs: a log lost with its Redis, or restored
  -- from an older copy (a restart from its last snapshot, a failover to a replica behind
  -- it), goes on above the number a worker holds, which then reads every change since;
  -- garbage ('=' not below 2^53, where + 1 adds nothing) starts again at that time
  local last = finite(redis_call('ZSCORE', KEYS[2], '='))
  if last and (last >= 2 ^ 53 or last + 1 <= last) then last = nil end
  local n = int_str(math_max(last and last + 1 or 0, now * 1000))
  redis_call('ZADD', KEYS[2], n, '=', n, ARGV[1])
  local oldest = redis_call('ZRANGE', KEYS[2], 0, SWEEP - 1)
  for _, domain in ipairs(oldest) do
    if domain ~= '=' then
      local open_at = finite(redis_call('HGET', KEYS[1], domain))
      if not open_at or open_at <= now then
        redis_call('HDEL', KEYS[1], domain)
        redis_call('ZREM', KEYS[2], domain)
      end
    end
  end
end
return untl
