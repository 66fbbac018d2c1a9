-- items_put_back: entries set aside (items_aside.lua) go back to the crawl's item stream,
-- once their sink (or the item) is fixed: each is added again as a new entry, for its group
-- alone (field 'g': the consumers of the other groups, which wrote it already, acknowledge
-- it without writing it), and leaves the set-aside stream, in one call.
-- Rule: lib/commit (an entry holds one item, field 'i'); lib/stream.
-- KEYS[1] the crawl's item stream  KEYS[2] the set-aside stream (items_aside)
-- KEYS[3] stats  KEYS[4] stats:min  KEYS[5] stats:domain (lib/stats: the counters
--         items_put_back and items_put_back:<group>)
-- ARGV the ids of set-aside entries (in items_aside)
-- Returns the number put back (an id not in the set-aside stream is skipped)
--- @include "time"
--- @include "types"
--- @include "stats"
local err = wrong_type('items_put_back', KEYS, {'stream', 'stream', 'hash', 'hash', 'hash'})
if err then return err end
local done = 0
for _, id in ipairs(ARGV) do
  local found = redis.call('XRANGE', KEYS[2], id, id)[1]
  if found then
    local f = {}
    for j = 1, #found[2], 2 do f[found[2][j]] = found[2][j + 1] end
    if f['i'] and f['i'] ~= '' and f['g'] then
      redis.call('XADD', KEYS[1], '*', 'i', f['i'], 'g', f['g'])
      count('items_put_back', 1, nil, f['g'])
      done = done + 1
    end
    redis.call('XDEL', KEYS[2], id)
  end
end
write_stats(KEYS[3], KEYS[4], KEYS[5], now_ms())
return done
