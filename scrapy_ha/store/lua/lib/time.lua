-- lib/time: the one clock of the data model.
--
-- now_ms()
--   Returns the Redis server's time in milliseconds since the epoch (an integer).
--   Rule: every time a script stores or compares (lease expiries, heartbeats, due times,
--   gate openings, dead-letter stamps) comes from the server, so workers whose clocks
--   disagree still agree on every deadline. Redis 7 replicates a script by its effects,
--   so a script may read TIME before it writes.
local function now_ms()
  local t = redis_call('TIME')
  return tonumber(t[1]) * 1000 + math_floor(tonumber(t[2]) / 1000)
end
