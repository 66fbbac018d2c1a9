-- items_ack: a sink's consumer acknowledges the stream entries its sink has committed,
-- counts them, deletes their single-write counts (items_tries: an entry acknowledged is
-- done, however it was: its offset file read after a kill, deleted while pending), and trims
-- the entries every consumer group has acknowledged.
-- Rule: lib/stream (an entry leaves the stream only once every group acknowledged it).
-- KEYS[1] the crawl's item stream
-- KEYS[2] stats  KEYS[3] stats:min  KEYS[4] stats:domain (lib/stats: the counters
--         items_consumed and items_consumed:<group>)
-- KEYS[5] the consumers' single-write attempts (items_tries: fields '<entry id> <group>')
-- ARGV[1] the consumer group  then ARGV[2] ... the entry ids acknowledged
-- Returns {acknowledged (entries that were pending in the group), trimmed (entries deleted)}
--- @include "time"
--- @include "types"
--- @include "stats"
--- @include "stream"
local err = wrong_type('items_ack', KEYS, {'stream', 'hash', 'hash', 'hash', 'hash'})
if err then return err end
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, 0} end
local acked = 0
if #ARGV > 1 then
  acked = redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 2))
end
if KEYS[5] and redis.call('EXISTS', KEYS[5]) == 1 then
  for i = 2, #ARGV do redis.call('HDEL', KEYS[5], stream_try_field(ARGV[i], ARGV[1])) end
end
count('items_consumed', acked, nil, ARGV[1])
local trimmed = 0
local floor = stream_floor(KEYS[1])
if floor then trimmed = redis.call('XTRIM', KEYS[1], 'MINID', floor) end
write_stats(KEYS[2], KEYS[3], KEYS[4], now_ms())
return {acked, trimmed}
