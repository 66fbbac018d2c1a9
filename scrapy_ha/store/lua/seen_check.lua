-- seen_check: where the Bloom filter in time slices holds fingerprints (`scrapy-ha seen
-- check`); it writes nothing (no slot is dropped or opened).
-- KEYS[1] the filter's meta hash (lib/aged: it names the slots' bitmaps)
-- KEYS[2] the back queues' prefix (lib/frontier): never a key, declared so that on a Redis
--         Cluster whose slot of the crawl migrates the call is refused whole (TRYAGAIN)
--         until it has moved, not run where KEYS[1] is while its bitmaps have moved
--         ("Script attempted to access a non local key" part-way)
-- ARGV[1] the dupefilter's spec, 'bloom-ttl <ttl> <capacity> <k> <part> <error>' (lib/seen)
-- ARGV[2..] fingerprints, as the scripts that enqueue take them (16 bytes)
-- Returns, for each fingerprint, the start (server ms) of the newest slot within the ttl
-- that holds it (a link to it would be filtered: seen then, or a false positive), else 0;
-- then the server's time (ms).
--- @include "time"
--- @include "aged"
local now = now_ms()
local d, err = aged_bloom_open('seen_check', KEYS[1], ARGV[1], now)
if err then return err end
local found = {}
for i = 2, #ARGV do
  found[#found + 1] = aged_seen(d, ARGV[i]) or 0
end
found[#found + 1] = now
return found
