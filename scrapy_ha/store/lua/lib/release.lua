--- @include "lease"
--- @include "polite"
--- @include "frontier"
-- lib/release: a lease given back to pending at once, at the place it was leased from in its
-- host's back queue (lib/frontier): at a graceful stop (release.lua), and for the buffered
-- requests a worker gives back in the call that stores the new ones it keeps in their place
-- (sync.lua; see scheduler/keep.py). The caller opened the frontier (frontier_open) and
-- closes it; a queue waiting for a slot this frees is woken by the caller (polite_woken).
--
-- release_lease(leased, leases, payloads, polite, id, token)
--   KEYS: leased, leases, payload and polite (the caller's KEYS[i])
--   Returns true when token was the entry's current lease token and the entry is pending
--   again (a record whose restore score cannot be read goes back at priority 0: never
--   half-released; its domain's concurrency slot is freed); false, nothing changed, if not.
local function release_lease(leased, leases, payloads, polite, id, token)
  local record = lease_current(leases, id, token)
  if not record then return false end
  local qid, place = queue_of(lease_score(record) or 0, lease_domain(record))
  frontier_return(qid, id, place, redis_call('HGET', payloads, id) or '')
  redis_call('HDEL', payloads, id)
  redis_call('ZREM', leased, id)
  redis_call('HDEL', leases, id)
  polite_free(polite, {id})
  return true
end
