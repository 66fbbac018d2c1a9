--- @include "number"
-- lib/gatelog: the log of the gates' changes, so that a sync returns only the gates that
-- changed since the number its worker last saw (sync.lua), not every gate at every call.
--   log: sorted set domain -> the number of its gate's last change (a close, gate.lua),
--        '!<domain>' -> the number of an operator's open of its gate (gate_open.lua), '='
--        -> the last number given

-- gate_log_write(log, domains, now)
--   Gives the changes of the domains of the list domains one new number (server ms now).
--   Rule: numbers are at least the server's time in µs: a log lost with its Redis, or
--   restored from an older copy (a restart from its last snapshot, a failover to a replica
--   behind it), goes on above the number a worker holds, which then reads every change
--   since; garbage ('=' not below 2^53, where + 1 adds nothing) starts again at that time.
local function gate_log_write(log, domains, now)
  local last = finite(redis_call('ZSCORE', log, '='))
  if last and (last >= 2 ^ 53 or last + 1 <= last) then last = nil end
  local n = int_str(math_max(last and last + 1 or 0, now * 1000))
  local args = {'ZADD', log, n, '='}
  for _, domain in ipairs(domains) do
    args[#args + 1] = n
    args[#args + 1] = domain
  end
  redis_call(unpack(args))
end
