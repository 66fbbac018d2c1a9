-- gate_open: open domains' gates now, for every worker (an operator's `scrapy-ha gates
--   open`): their gates leave the hash, and the log gets a mark '!<domain>' of each open
--   (kept 10 minutes, gate.lua), so that each worker's next sync opens its copy (sync.lua
--   returns the domain with the time 0, and a later close of it after that).
-- KEYS[1] gates  KEYS[2] gate log (gate.lua)
-- ARGV the domains to open; none: every gate closed now
-- Returns domain1, open_at1, ... for each gate that was closed (open_at: the server ms it
--   would have opened at); a domain whose gate was not closed is left as it is.
--- @include "time"
--- @include "number"
--- @include "gatelog"
local now = now_ms()
local domains = ARGV
if #domains == 0 then
  domains = redis_call('HKEYS', KEYS[1])
end
local out, opened = {}, {}
for _, domain in ipairs(domains) do
  local open_at = finite(redis_call('HGET', KEYS[1], domain))
  if open_at and open_at > now then
    redis_call('HDEL', KEYS[1], domain)
    opened[#opened + 1] = domain
    out[#out + 1] = domain
    out[#out + 1] = int_str(math_ceil(open_at))
  end
end
-- (a log of another type: the gates are open in Redis, and the next sync sets it aside;
-- workers then read every gate closed now, which no longer holds these)
if #opened > 0 and (redis_call('TYPE', KEYS[2])['ok'] == 'zset'
    or redis_call('EXISTS', KEYS[2]) == 0) then
  local marks = {}
  for i, domain in ipairs(opened) do marks[i] = '!' .. domain end
  gate_log_write(KEYS[2], marks, now)
end
return out
