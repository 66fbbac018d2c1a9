-- checkpoint: save a task's checkpoint, only while the lease of the page that wrote it is
-- current (a stale worker cannot overwrite a newer checkpoint).
-- KEYS[1] leases  KEYS[2] the task's checkpoint key
-- ARGV[1] entry id of the page  ARGV[2] its lease token  ARGV[3] checkpoint (JSON)
-- ARGV[4] time to live (ms)
-- Returns 1 when saved, 0 when the lease is stale.
--- @include "lease"
local ttl = tonumber(ARGV[4])
if not ttl or ttl <= 0 then
  return redis.error_reply('ERR checkpoint: the time to live must be a positive number')
end
if not lease_current(KEYS[1], ARGV[1], ARGV[2]) then
  return 0
end
redis.call('SET', KEYS[2], ARGV[3], 'PX', ttl)
return 1
