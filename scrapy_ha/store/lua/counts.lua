-- counts: the size of every state of a crawl, read at one instant.
-- KEYS[1] pending  KEYS[2] leased  KEYS[3] delayed  KEYS[4] dead  KEYS[5] workers
-- KEYS[6] dupefilter (the exact set)  KEYS[7] the Bloom filter's meta hash (lib/seen): a
-- crawl has one of the two  KEYS[8..] the exact set's time slices (lib/aged), if any
-- Returns {now_ms, pending, leased, delayed, dead, live workers, fingerprints} (a
-- fingerprint in two slices is counted twice).
--- @include "time"
--- @include "seen"
local now = now_ms()
local fingerprints = seen_count(KEYS[6]) + seen_count(KEYS[7])
for i = 8, #KEYS do fingerprints = fingerprints + redis.call('SCARD', KEYS[i]) end
return {now, redis.call('ZCARD', KEYS[1]), redis.call('ZCARD', KEYS[2]),
  redis.call('ZCARD', KEYS[3]), redis.call('ZCARD', KEYS[4]),
  redis.call('ZCOUNT', KEYS[5], now, '+inf'), fingerprints}
