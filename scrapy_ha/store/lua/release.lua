-- release: give leases back to pending at once (graceful stop), keeping their order: each
-- goes back to its place in its back queue (lib/frontier, lib/release).
-- KEYS[1] the back queues' prefix (lib/frontier)  KEYS[2] leased  KEYS[3] leases
-- KEYS[4] payload
-- KEYS[5] polite (lib/polite: a released lease frees its domain's concurrency slot)
-- KEYS[6] ready  KEYS[7] waiting  KEYS[8] queued (lib/frontier)
-- ARGV[1] the crawl's order within a priority: 'fifo' or 'lifo', then optionally ' fifo' or
--         ' lifo' for its start queue (the places of the back queues' elements follow from it)
-- then pairs: entry id, lease token
-- Returns the number released; a stale token releases nothing. A lease record whose
-- restore score cannot be read goes back at priority 0 (never half-released).
--- @include "release"
local lifo, start_lifo = order_flags(ARGV[1])
if lifo == nil or #ARGV % 2 ~= 1 then
  return redis.error_reply('ERR release: the order, then (id, token) pairs')
end
frontier_open(KEYS[1], KEYS[6], KEYS[7], KEYS[8], lifo, start_lifo)
local n = 0
for i = 2, #ARGV, 2 do
  if release_lease(KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[i], ARGV[i + 1]) then
    n = n + 1
  end
end
polite_woken(KEYS[5], frontier_wake_one)
polite_write(KEYS[5])
frontier_close()
return n
