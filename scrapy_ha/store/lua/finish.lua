-- finish: clear a finished crawl's working keys (SCHEDULER_PERSIST = False), only when
-- nothing is pending, leased or delayed and no other worker is alive. The dead-letter
-- queue (and the payloads of its entries) is kept for the operator.
-- KEYS[1] pending  KEYS[2] leased  KEYS[3] delayed  KEYS[4] workers
-- KEYS[5..] keys to delete
-- ARGV[1] this worker's id
-- Returns 1 when cleared, 0 when the crawl is still in use.
--- @include "time"
local now = now_ms()
if redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2]) + redis.call('ZCARD', KEYS[3]) > 0 then
  return 0
end
redis.call('ZREM', KEYS[4], ARGV[1])
if redis.call('ZCOUNT', KEYS[4], now, '+inf') > 0 then
  return 0
end
for i = 5, #KEYS do
  redis.call('DEL', KEYS[i])
end
return 1
