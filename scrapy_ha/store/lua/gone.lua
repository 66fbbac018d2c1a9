-- gone: a compaction dictionary read by a worker, and if the key lacks it, since when the
-- crawl's workers have found it missing, by Redis's clock (scrapy_ha/store/dictionary.py:
-- the requests compacted with it wait for it that long at most, however many workers
-- restart meanwhile, whatever their clocks say).
-- KEYS[1] dictionaries (a hash: id -> data, `current`, `gone:<id>` -> server ms)
-- ARGV[1] the dictionary's id
-- Returns {its data, nil, now} when the key holds it (a `gone:<id>` left behind is deleted:
-- put back by hand, or a race with its write-back), else {nil, since, now}: the first
-- finder's time, written now if none is (or garbage, or a time to come: written over).
--- @include "time"
--- @include "number"
local gone = 'gone:' .. ARGV[1]
local now = now_ms()
local data = redis_call('HGET', KEYS[1], ARGV[1])
if data then
  redis_call('HDEL', KEYS[1], gone)
  return {data, false, int_str(now)}
end
local since = finite(redis_call('HGET', KEYS[1], gone))
if not since or since > now or since < 0 then
  since = now
  redis_call('HSET', KEYS[1], gone, int_str(now))
end
return {false, int_str(since), int_str(now)}
