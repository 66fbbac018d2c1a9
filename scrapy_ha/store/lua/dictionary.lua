-- dictionary: publish a compaction dictionary as the crawl's current one, unless one is
-- current already (scrapy_ha/store/dictionary.py): its data under its id and the id in
-- the field `current` at once, so that no worker stores a dictionary none compacts with,
-- and `current` never names one the key lacks.
-- KEYS[1] dictionaries (a hash: id -> data, `current` -> the id new requests compact with)
-- ARGV[1] the new dictionary's id (2 to 255), ARGV[2] its data
-- Returns {the current id, its data} (the new one's if it is current now; its data nil if
-- the key lacks it: written by hand), or nil when no dictionary is current and the id
-- holds another (the caller takes another id). A key with no `current` and a dictionary
-- under 1 is an earlier version's: that one is current (its workers, crawling beside this
-- version's, read no frames of another).
local current = redis_call('HGET', KEYS[1], 'current')
if not current and redis_call('HEXISTS', KEYS[1], '1') == 1 then current = '1' end
if not current then
  if redis_call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return false end
  redis_call('HSET', KEYS[1], 'current', ARGV[1])
  current = ARGV[1]
end
return {current, redis_call('HGET', KEYS[1], current)}
