-- finish: the last worker of a finished crawl ends it, only when nothing is pending, leased
-- or delayed and no other worker is alive.
--   'clear' (SCHEDULER_PERSIST = False): the working keys go (KEYS[6..], the cookie jars
--   among them); the dead-letter queue (and the payloads of its entries) and the counters
--   are kept for the operator.
--   'keep' (SCHEDULER_PERSIST = True): everything stays but the session cookies of the
--   shared jars: a session belongs to the run that opened it, and the next run of a
--   finished crawl is another run (a stopped or killed crawl keeps them: it resumes).
-- KEYS[1] pending  KEYS[2] leased  KEYS[3] delayed  KEYS[4] workers  KEYS[5] cookies
-- KEYS[6..] keys to delete ('clear')
-- ARGV[1] this worker's id  ARGV[2] 'clear' or 'keep'
-- Returns {1, session cookies dropped ('keep'; 0 for 'clear')} when the crawl was ended,
-- {0, 0} when it is still in use.
--- @include "time"
--- @include "jars"
if ARGV[2] ~= 'clear' and ARGV[2] ~= 'keep' then
  return redis.error_reply("ERR finish: the mode must be 'clear' or 'keep'")
end
local now = now_ms()
if redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2]) + redis.call('ZCARD', KEYS[3]) > 0 then
  return {0, 0}
end
redis.call('ZREM', KEYS[4], ARGV[1])
if redis.call('ZCOUNT', KEYS[4], now, '+inf') > 0 then
  return {0, 0}
end

if ARGV[2] == 'keep' then
  return {1, end_sessions(KEYS[5], math.floor(now / 1000))}
end
for i = 5, #KEYS do
  redis.call('DEL', KEYS[i])
end
return {1, 0}
