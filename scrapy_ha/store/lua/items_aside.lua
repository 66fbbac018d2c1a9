-- items_aside: a sink's consumer sets aside an entry its sink cannot write (it failed on its
-- own while the sink committed other entries: sinks/triage.py): the entry is copied, with
-- the group, the consumer and the reason, to the crawl's set-aside stream, and acknowledged
-- in the group, in one call (never both lost, never left pending and copied).
-- Rule: lib/stream (an entry leaves the stream only once every group acknowledged it).
-- KEYS[1] the crawl's item stream  KEYS[2] the set-aside stream (items_aside)
-- KEYS[3] stats  KEYS[4] stats:min  KEYS[5] stats:domain (lib/stats: the counters
--         items_aside and items_aside:<group>)
-- ARGV[1] the consumer group  ARGV[2] the consumer  ARGV[3] the entry id  ARGV[4] the reason
-- Returns {set aside (1, or 0 for an entry not pending in the group), trimmed}
--- @include "time"
--- @include "types"
--- @include "stats"
--- @include "stream"
local err = wrong_type('items_aside', KEYS, {'stream', 'stream', 'hash', 'hash', 'hash'})
if err then return err end
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, 0} end
if redis.call('XACK', KEYS[1], ARGV[1], ARGV[3]) == 0 then return {0, 0} end
local found = redis.call('XRANGE', KEYS[1], ARGV[3], ARGV[3])
local item = ''
if found[1] then
  local fields = found[1][2]
  for j = 1, #fields, 2 do
    if fields[j] == 'i' then item = fields[j + 1] end
  end
end
redis.call('XADD', KEYS[2], '*', 'g', ARGV[1], 'c', ARGV[2], 'e', ARGV[3], 'r', ARGV[4],
  'i', item)
count('items_aside', 1, nil, ARGV[1])
local trimmed = 0
local floor = stream_floor(KEYS[1])
if floor then trimmed = redis.call('XTRIM', KEYS[1], 'MINID', floor) end
write_stats(KEYS[3], KEYS[4], KEYS[5], now_ms())
return {1, trimmed}
