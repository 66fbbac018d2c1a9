-- seen_check: where the dupefilter in time slices holds fingerprints (`scrapy-ha seen
-- check`), by lib/aged's own rule (a slot that ended a TTL ago holds nothing, though it is
-- dropped only at the crawl's next write); it writes nothing (no slot is dropped or opened).
-- The Bloom filter's slices (ARGV[1] 'bloom-ttl ...'):
--   KEYS[1] the filter's meta hash (lib/aged: it names the slots' bitmaps)
--   KEYS[2] the back queues' prefix (lib/frontier): never a key, declared so that on a Redis
--           Cluster whose slot of the crawl migrates the call is refused whole (TRYAGAIN)
--           until it has moved, not run where KEYS[1] is while its bitmaps have moved
--           ("Script attempted to access a non local key" part-way)
-- The exact set's slices (ARGV[1] 'set <ttl>'):
--   KEYS[1] the set kept for ever (taken over by the first slice)  KEYS[2] as above
--   KEYS[3] the buckets' meta hash  KEYS[4] the slices' hash  KEYS[5..] the slots' sets
-- ARGV[1] the dupefilter's spec (lib/seen)
-- ARGV[2..] fingerprints, as the scripts that enqueue take them (16 bytes for the Bloom
--           filter, 12 for the set)
-- Returns, for each fingerprint, the start (server ms) of the newest slot within the ttl
-- that holds it (a link to it would be filtered: seen then, or a false positive), else 0
-- (also for the set kept for ever, which the caller reads itself); then the server's time
-- (ms).
--- @include "time"
--- @include "aged"
local now = now_ms()
local d, err
if string.sub(ARGV[1] or '', 1, 4) == 'set ' then
  d, err = aged_open('seen_check', KEYS[1], ARGV[1], KEYS, now)
else
  d, err = aged_bloom_open('seen_check', KEYS[1], ARGV[1], now)
end
if err then return err end
local found = {}
for i = 2, #ARGV do
  local start = aged_seen(d, ARGV[i])
  found[#found + 1] = type(start) == 'number' and start or 0
end
found[#found + 1] = now
return found
