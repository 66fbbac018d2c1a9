-- gate: close a domain for every worker until a time (never shortens an existing gate).
-- KEYS[1] gates  KEYS[2] gate log (optional; sorted set): domain -> the number of its gate's
--   last change, '=' -> the last number given; a sync returns the gates changed since the
--   number its worker last saw (sync.lua), not every gate at every call
-- ARGV[1] domain  ARGV[2] how long (ms)
-- Returns the time (server ms) the domain opens again.
--- @include "time"
--- @include "number"
--- @include "gatelog"
-- SWEEP: the log's oldest entries looked at per close, their expired gates deleted (a sync
-- never deletes one): the hash and the log stay about the size of the gates closed now.
-- KEEP_MS: how long the mark of an operator's early open ('!<domain>', gate_open.lua) stays
-- in the log, for every worker's sync to read it (a worker that has not read it by then
-- keeps its copy of the gate until the gate's own time).
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
  local kept = (now - KEEP_MS) * 1000
  local oldest = redis_call('ZRANGE', KEYS[2], 0, SWEEP - 1, 'WITHSCORES')
  for i = 1, #oldest, 2 do
    local domain = oldest[i]
    if str_byte(domain) == 33 then -- '!': an open's mark
      if tonumber(oldest[i + 1]) < kept then redis_call('ZREM', KEYS[2], domain) end
    elseif domain ~= '=' then
      local open_at = finite(redis_call('HGET', KEYS[1], domain))
      if not open_at or open_at <= now then
        redis_call('HDEL', KEYS[1], domain)
        redis_call('ZREM', KEYS[2], domain)
      end
    end
  end
end
return untl
