--- @include "lease"
--- @include "member"
--- @include "polite"
-- lib/release: a lease given back to pending at once, at the place it was leased from: at a
-- graceful stop (release.lua), and for the buffered requests a worker gives back in the call
-- that stores the new ones it keeps in their place (sync.lua; see scheduler/keep.py).
--
-- release_lease(pending, leased, leases, payloads, polite, id, token)
--   KEYS: pending, leased, leases, payload and polite (the caller's KEYS[i])
--   Returns true when token was the entry's current lease token and the entry is pending
--   again (a record whose restore score cannot be read goes back at priority 0: never
--   half-released; its domain's concurrency slot is freed); false, nothing changed, if not.
local function release_lease(pending, leased, leases, payloads, polite, id, token)
  local record = lease_current(leases, id, token)
  if not record then return false end
  back_to_pending(pending, payloads, id, lease_score(record) or 0)
  redis.call('ZREM', leased, id)
  redis.call('HDEL', leases, id)
  polite_free(polite, id)
  return true
end
