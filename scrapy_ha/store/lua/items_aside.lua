-- items_aside: a sink's consumer sets aside a stream entry its sink cannot write (it failed
-- alone while the sink committed other entries, or the consumer died writing it: see
-- sinks/isolate.py): the entry is copied, byte for byte, with the group and why, to the
-- crawl's set-aside stream, and acknowledged in the group, in one call: a kill at any
-- instant leaves it pending or aside in Redis, never both, never neither. Fenced: only the consumer
-- the entry is pending to may set it aside (an entry acknowledged meanwhile by a consumer
-- that committed it, or taken over by another, is not set aside).
-- Rule: lib/stream (an entry leaves the stream only once every group acknowledged it).
-- KEYS[1] the crawl's item stream  KEYS[2] the set-aside stream (items_aside)
-- KEYS[3] the consumers' single-write attempts (items_tries; the entry's field is deleted)
-- KEYS[4] stats  KEYS[5] stats:min  KEYS[6] stats:domain (lib/stats: the counters
--         items_aside and items_aside:<group>)
-- ARGV[1] the consumer group  ARGV[2] the consumer  ARGV[3] the entry id (of this stream)
-- ARGV[4] the reason (UTF-8, cut by the caller)  ARGV[5] the entry's field in KEYS[3]
-- Returns {1, trimmed} set aside; {0, 0} the entry is not pending in the group (acknowledged
-- already, deleted, or no such group); {-1, 0} it is pending to another consumer
--- @include "time"
--- @include "types"
--- @include "stats"
--- @include "stream"
local err = wrong_type('items_aside', KEYS, {'stream', 'stream', 'hash', 'hash', 'hash', 'hash'})
if err then return err end
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, 0} end
local pending = redis.pcall('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if type(pending) ~= 'table' or not pending[1] or pending[1][1] ~= ARGV[3] then return {0, 0} end
if pending[1][2] ~= ARGV[2] then return {-1, 0} end
local found = redis.call('XRANGE', KEYS[1], ARGV[3], ARGV[3])
if not found[1] then return {0, 0} end
local item
local fields = found[1][2]
for j = 1, #fields, 2 do
  if fields[j] == 'i' then item = fields[j + 1] end
end
-- an entry without the item's field (written by hand) is set aside as an empty item: its
-- reason says so, and it leaves the group's pending entries
item = item or ''
local now = now_ms()
redis.call('XADD', KEYS[2], '*', 'e', ARGV[3], 'g', ARGV[1], 'r', ARGV[4], 't', now, 'i', item)
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
redis.call('HDEL', KEYS[3], ARGV[5])
count('items_aside', 1, nil, ARGV[1])
local trimmed = 0
local floor = stream_floor(KEYS[1])
if floor then trimmed = redis.call('XTRIM', KEYS[1], 'MINID', floor) end
write_stats(KEYS[4], KEYS[5], KEYS[6], now)
return {1, trimmed}
