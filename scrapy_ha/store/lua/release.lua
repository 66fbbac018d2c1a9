-- release: give leases back to pending at once (graceful stop), keeping their order.
-- KEYS[1] pending  KEYS[2] leased  KEYS[3] leases  KEYS[4] payload
-- KEYS[5] polite (lib/polite: a released lease frees its domain's concurrency slot)
-- ARGV pairs: entry id, lease token
-- Returns the number released; a stale token releases nothing. A lease record whose
-- restore score cannot be read goes back at priority 0 (never half-released).
--- @include "lease"
--- @include "member"
--- @include "polite"
local n = 0
for i = 1, #ARGV, 2 do
  local id, tok = ARGV[i], ARGV[i + 1]
  local v = lease_current(KEYS[3], id, tok)
  if v then
    back_to_pending(KEYS[1], KEYS[4], id, lease_score(v) or 0)
    redis.call('ZREM', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    polite_free(KEYS[5], id)
    n = n + 1
  end
end
polite_write(KEYS[5])
return n
