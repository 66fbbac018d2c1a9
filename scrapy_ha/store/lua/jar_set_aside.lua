-- jar_set_aside: set a malformed cookie jar aside if it is still the value the worker read
-- (two workers that find it at once move it once).
-- KEYS[1] the crawl's cookies hash
-- ARGV[1] the jar's field  ARGV[2] the value read
-- Returns 1 if moved to the field 'bad-' .. ARGV[1], 0 if another worker changed it meanwhile.
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'bad-' .. ARGV[1], ARGV[2])
redis.call('HDEL', KEYS[1], ARGV[1])
return 1
