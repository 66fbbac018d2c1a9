-- items_aside: a sink's consumer sets aside an entry its sink cannot write (it failed alone,
-- every entry before it committed, N times with an error the sink does not call retryable:
-- sinks/aside.py): the entry is copied with why to the crawl's set-aside stream and
-- acknowledged in the group, in one call: never copied and left pending, never acknowledged
-- and not copied. Fenced: only the consumer the entry is pending to may set it aside (one
-- whose entry another consumer took over, XAUTOCLAIM, sets aside nothing).
-- Rule: lib/stream (an entry leaves the stream only once every group acknowledged it).
-- KEYS[1] the crawl's item stream  KEYS[2] the set-aside stream (items_aside)
-- KEYS[3] stats  KEYS[4] stats:min  KEYS[5] stats:domain (lib/stats: the counters
--         items_aside and items_aside:<group>)
-- ARGV[1] the consumer group  ARGV[2] the consumer  ARGV[3] the entry id  ARGV[4] the sink's
--         name  ARGV[5] the reason (masked by the caller; cut to REASON_BYTES here)
--         ARGV[6] the failures alone
-- Returns {1, trimmed} set aside; {0, 0} the entry is not pending in the group (acknowledged
-- already, or no such group); {-1, 0} it is pending to another consumer (taken over)
--- @include "time"
--- @include "types"
--- @include "stats"
--- @include "stream"
local REASON_BYTES = 2000
local err = wrong_type('items_aside', KEYS, {'stream', 'stream', 'hash', 'hash', 'hash'})
if err then return err end
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, 0} end
local pending = redis.pcall('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if type(pending) ~= 'table' or not pending[1] or pending[1][1] ~= ARGV[3] then return {0, 0} end
if pending[1][2] ~= ARGV[2] then return {-1, 0} end
local found = redis.call('XRANGE', KEYS[1], ARGV[3], ARGV[3])
local item = ''
if found[1] then
  local fields = found[1][2]
  for j = 1, #fields, 2 do
    if fields[j] == 'i' then item = fields[j + 1] end
  end
end
redis.call('XADD', KEYS[2], '*', 'e', ARGV[3], 'g', ARGV[1], 'c', ARGV[2], 's', ARGV[4],
  'r', string.sub(ARGV[5], 1, REASON_BYTES), 'n', ARGV[6], 'i', item)
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
count('items_aside', 1, nil, ARGV[1])
local trimmed = 0
local floor = stream_floor(KEYS[1])
if floor then trimmed = redis.call('XTRIM', KEYS[1], 'MINID', floor) end
write_stats(KEYS[3], KEYS[4], KEYS[5], now_ms())
return {1, trimmed}
