-- release: give leases back to pending at once (graceful stop), keeping their order.
-- KEYS[1] pending  KEYS[2] leased  KEYS[3] leases  KEYS[4] payload
-- KEYS[5] polite (lib/polite: a released lease frees its domain's concurrency slot)
-- ARGV pairs: entry id, lease token
-- Returns the number released; a stale token releases nothing. A lease record whose
-- restore score cannot be read goes back at priority 0 (never half-released).
--- @include "release"
local n = 0
for i = 1, #ARGV, 2 do
  if release_lease(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[i], ARGV[i + 1]) then
    n = n + 1
  end
end
polite_write(KEYS[5])
return n
