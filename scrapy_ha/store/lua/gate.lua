-- gate: close a domain for every worker until a time (never shortens an existing gate).
-- KEYS[1] gates
-- ARGV[1] domain  ARGV[2] how long (ms)
-- Returns the time (server ms) the domain opens again.
--- @include "time"
--- @include "number"
local untl = now_ms() + tonumber(ARGV[2])
local old = finite(redis_call('HGET', KEYS[1], ARGV[1])) or 0 -- garbage: written over
if old > untl then
  return old
end
redis_call('HSET', KEYS[1], ARGV[1], int_str(untl))
return untl
