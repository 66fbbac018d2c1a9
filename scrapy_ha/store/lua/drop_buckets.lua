-- drop_buckets: delete a range of the buckets of one generation of the exact set (lib/seen),
-- those of a crawl finished or made again (store/buckets.py: delete_buckets), so that the
-- worker sends three numbers a batch instead of every bucket's name.
-- Rule kept: a bucket is named as lib/seen names it (buckets_prefix).
-- KEYS[1] the buckets' meta hash (the buckets are named from it; not read)
-- KEYS[2] the back queues' prefix (lib/frontier): never a key, declared so that on a Redis
--         Cluster whose slot of the crawl migrates the call is refused whole (TRYAGAIN)
--         until it has moved, not run where KEYS[1] is while the buckets have moved
--         ("Script attempted to access a non local key" part-way)
-- ARGV[1] gen  ARGV[2] the first bucket  ARGV[3] the last bucket (both deleted)
-- Returns how many of those buckets existed.
--- @include "seen"
local first, last = tonumber(ARGV[2]), tonumber(ARGV[3])
if not (first and last) or first ~= math.floor(first) or last ~= math.floor(last) then
  return redis.error_reply('ERR drop_buckets: bad range')
end
local prefix = buckets_prefix(KEYS[1], ARGV[1])
-- one UNLINK of up to UNLINK_KEYS names, not a call into Redis per bucket: most buckets of a
-- small crawl were never made (32,768 buckets, 4,096 of them made: 18.5 ms of Redis's time
-- with a call each, 15 ms with these)
local UNLINK_KEYS = 1000
local dropped, names = 0, {}
for i = first, last do
  names[#names + 1] = prefix .. i
  if #names == UNLINK_KEYS then
    dropped = dropped + redis.call('UNLINK', unpack(names))
    names = {}
  end
end
if #names > 0 then
  dropped = dropped + redis.call('UNLINK', unpack(names))
end
return dropped
