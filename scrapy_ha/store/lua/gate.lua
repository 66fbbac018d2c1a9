-- gate: close a domain for every worker until a time (never shortens an existing gate).
-- KEYS[1] gates  KEYS[2] gate log (optional; sorted set): domain -> the number of its gate's
--   last change, '=' -> the last number given; a sync returns the gates changed since the
--   number its worker last saw (sync.lua), not every gate at every call
-- ARGV[1] domain  ARGV[2] how long (ms)
-- Returns the time (server ms) the domain opens again.
--- @include "time"
--- @include "number"
--- @include "gatelog"
-- SWEEP: the log's oldest entries looked at per close, their gates deleted once open and
-- changed KEEP_MS ago or more (a sync never deletes one): the hash and the log stay about
-- the size of the gates closed or changed in that time. KEEP_MS: a gate an operator opened
-- early (gate_open.lua) stays in the log that long, for every worker's sync to read it
-- (before it is swept, a worker that has not read it holds its own copy of the gate).
local SWEEP, KEEP_MS = 16, 600000
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
  gate_log_write(KEYS[2], {ARGV[1]}, now)
  -- (the log's numbers are at least the server's time in µs when each change was made)
  local oldest = redis_call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. int_str((now - KEEP_MS)
    * 1000), 'LIMIT', 0, SWEEP)
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
