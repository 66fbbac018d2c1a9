-- checkpoint: save a task's checkpoint, only while the lease of the page that wrote it is
-- current (a stale worker cannot overwrite a newer checkpoint).
-- Rule: lib/checkpoint (a checkpoint never moves past a page of its chain that has not
-- completed; a page behind it never moves it back).
-- KEYS[1] leases  KEYS[2] the task's checkpoint key  KEYS[3] the task's ahead hash
-- ARGV[1] entry id of the page  ARGV[2] its lease token  ARGV[3] checkpoint (JSON)
-- ARGV[4] time to live (ms)
-- Returns 1 when saved (or kept aside), 0 when the lease is stale, 2 when the page is
-- behind the checkpoint (not saved); an error reply, before any write, for a checkpoint
-- that cannot be saved or a task key of another type ('WRONGTYPE checkpoint: <key> ...').
--- @include "lease"
--- @include "checkpoint"
local new, ttl = checkpoint_doc(ARGV[3], ARGV[4], KEYS[2], KEYS[3])
if not new then return ttl end
if not lease_current(KEYS[1], ARGV[1], ARGV[2]) then
  return 0
end
return checkpoint_save(KEYS[2], KEYS[3], ARGV[3], new, ttl)
