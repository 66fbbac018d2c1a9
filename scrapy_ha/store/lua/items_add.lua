-- items_add: items that no page yielded (a spider's start() yields items too) added to the
-- crawl's item stream as they come: no lease fences them.
-- Rule: lib/commit (an entry holds one item, field 'i'); the items of a page never come
-- here, they go with the page's ack.
-- KEYS[1] the crawl's item stream
-- KEYS[2] stats  KEYS[3] stats:min  KEYS[4] stats:domain (lib/stats: the counter items)
-- ARGV[1] ... the items (the codec's tagged JSON)
-- Returns the number of entries added
--- @include "time"
--- @include "types"
--- @include "stats"
local err = wrong_type('items_add', KEYS, {'stream', 'hash', 'hash', 'hash'})
if err then return err end
for i = 1, #ARGV do
  redis.call('XADD', KEYS[1], '*', 'i', ARGV[i])
end
count('items', #ARGV)
write_stats(KEYS[2], KEYS[3], KEYS[4], now_ms())
return #ARGV
