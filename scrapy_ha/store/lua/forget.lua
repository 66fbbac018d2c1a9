-- forget: remove fingerprints from the exact set's buckets (`scrapy-ha seen forget <url>`).
-- Rule kept: the buckets' meta hash counts the fingerprints they hold (lib/seen).
-- KEYS[1] the buckets' meta hash (lib/seen; the buckets are named from it)
-- KEYS[2] the back queues' prefix (lib/frontier): never a key, declared so that on a Redis
--         Cluster whose slot of the crawl migrates the call is refused whole (TRYAGAIN)
--         until it has moved, not run where KEYS[1] is while the buckets have moved
--         ("Script attempted to access a non local key" part-way)
-- ARGV[1..] fingerprints, each as the buckets take it (store/buckets.py: wire_fingerprint)
-- Returns how many of them the buckets held (0 when the crawl has no buckets).
--- @include "seen"
local d, err = buckets_open('forget', KEYS[1], 'buckets 1', 0) -- removes: any kind goes
if err then return err end
if d.fresh then return 0 end
local removed = 0
for i = 1, #ARGV do
  if seen_remove(d, ARGV[i]) then removed = removed + 1 end
end
seen_close(d)
return removed
