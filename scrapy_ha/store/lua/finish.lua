-- finish: the last worker of a finished crawl ends it, only when nothing is pending, leased
-- or delayed and no other worker is alive.
--   'clear' (SCHEDULER_PERSIST = False): the working keys go (the heartbeats, the cookie
--   jars and KEYS[10..]); the dead-letter queue (and the payloads of its entries) and the
--   counters are kept for the operator.
--   'keep' (SCHEDULER_PERSIST = True): everything stays but the session cookies of the
--   shared jars: a session belongs to the run that opened it, and the next run of a
--   finished crawl is another run (a stopped or killed crawl keeps them: it resumes).
-- Either way 'seq' stays, and so do the numbers of 'sent' of workers gone less than a
-- grace ago (lib/senders): a worker stopped meanwhile (SIGSTOP, a frozen VM), alive again,
-- must not see its number go back (it would store again the start requests it keeps, into
-- a crawl whose dupefilter is gone).
-- 'clear' records the crawl finished ('done' in KEYS[9]): only then may a worker with
-- another shard count take it over (join.lua). A sharded crawl is cleared shard by shard
-- under fence.lua instead, with the same keys.
-- KEYS[1] ready  KEYS[2] waiting (lib/frontier: a back queue holding requests is in one of
-- them)  KEYS[3] leased  KEYS[4] delayed  KEYS[5] workers  KEYS[6] cookies
-- KEYS[7] senders  KEYS[8] sent
-- KEYS[9] finish record ('clear')  KEYS[10..] the other keys to delete ('clear')
-- ARGV[1] this worker's id  ARGV[2] 'clear' or 'keep'
-- ARGV[3] ms a worker's number in 'sent' is kept after it was seen gone (lib/senders)
-- Returns {1, session cookies dropped ('keep'; 0 for 'clear')} when the crawl was ended,
-- {0, 0} when it is still in use, or was cleared by another worker and nothing was
-- written since ('done', and no working key: a worker whose heartbeat expired meanwhile and
-- that crawled on after the clear, never joining again, finds its keys and clears them).
--- @include "time"
--- @include "senders"
--- @include "jars"
if (ARGV[2] ~= 'clear' and ARGV[2] ~= 'keep') or not tonumber(ARGV[3]) then
  return redis.error_reply("ERR finish: the mode ('clear' or 'keep') and the grace")
end
local now = now_ms()
for i = 1, 4 do
  if redis.call('ZCARD', KEYS[i]) > 0 then return {0, 0} end
end
redis.call('ZREM', KEYS[5], ARGV[1])
if redis.call('ZCOUNT', KEYS[5], now, '+inf') > 0 then
  return {0, 0}
end
if ARGV[2] == 'clear' and redis.call('GET', KEYS[9]) == 'done'
    and redis.call('EXISTS', unpack(KEYS, 10)) == 0 then
  return {0, 0} -- another worker cleared it, and nothing was written since: nothing to do
end

prune_senders(KEYS[7], KEYS[8], KEYS[5], now, tonumber(ARGV[3]))
if ARGV[2] == 'keep' then
  return {1, end_sessions(KEYS[6], math.floor(now / 1000))}
end
redis.call('DEL', KEYS[5], KEYS[6])
for i = 10, #KEYS do
  redis.call('DEL', KEYS[i])
end
redis.call('SET', KEYS[9], 'done')
return {1, 0}
