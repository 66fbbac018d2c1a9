-- alert: decide, once for all workers, that the dead-letter queue crossed the alert
-- threshold, and keep that decision until the alert was delivered.
--   'check': the first caller that sees the queue at or above the threshold sets the marker
--     "pending" (its own value, with a TTL) and sends the alert; once the queue is back below,
--     the marker goes and the next crossing alerts again.
--   'sent': the POST succeeded: the marker, if it still holds the caller's pending value,
--     becomes "sent" (no TTL): no other alert until the queue goes below the threshold.
--   'failed': the POST failed: the marker goes if it still holds the caller's pending value,
--     so that a later check (this worker's or another's) sends the alert again.
--   'shrunk': an operator took entries out (a purge, a requeue): the marker goes if the queue
--     is now below the threshold its marker records, so that the next crossing alerts again
--     (a check sees the queue only after a dead letter: one past the threshold again).
--   Rule: the alert of a crossing is never lost: a pending marker lives until 'sent' or
--   'failed', or its TTL (a worker killed between the check and the POST's answer).
-- KEYS[1] dead  KEYS[2] dlq_alert marker
-- ARGV[1] 'check'  ARGV[2] threshold (entries)  ARGV[3] the pending marker  ARGV[4] its TTL (ms)
--   [ARGV[5] the queue's size, counted by the caller  ARGV[6] the marker it read first]
-- ARGV[1] 'sent'   ARGV[2] the caller's pending marker  ARGV[3] the sent marker
-- ARGV[1] 'failed' ARGV[2] the caller's pending marker
-- ARGV[1] 'shrunk' [ARGV[2] the queue's size, counted by the caller  ARGV[3] the marker]
-- A sharded crawl's marker is shard 0's; its queue is every shard's, which one call cannot
-- read (other slots): the caller counts them and passes the sum (KEYS[1], shard 0's, is
-- then not read), with the marker as it read it before counting ('' for none): a count
-- below the threshold takes away only that marker, for one set since is a crossing the
-- count, older, missed (it would be alerted twice).
-- Returns, for 'check', the number of dead letters when this caller is to send the alert,
-- else 0; for 'sent' and 'failed', 1 when the marker held the caller's value, else 0; for
-- 'shrunk', 1 when the marker went, else 0.
--- @include "types"
local err = wrong_type('alert', KEYS, {'zset', 'string'})
if err then return err end
local op = ARGV[1]
if op == 'sent' or op == 'failed' then
  if redis_call('GET', KEYS[2]) ~= ARGV[2] then return 0 end
  if op == 'sent' then
    redis_call('SET', KEYS[2], ARGV[3])
  else
    redis_call('DEL', KEYS[2])
  end
  return 1
end
local given, seen = ARGV[5], ARGV[6]
if op == 'shrunk' then given, seen = ARGV[2], ARGV[3] end
local n = given and tonumber(given) or redis_call('ZCARD', KEYS[1])
local marker = redis_call('GET', KEYS[2])
local kept = seen and (marker or '') ~= seen  -- set since the caller counted: not ours to take
if op == 'shrunk' then
  local ok, doc = pcall(cjson.decode, marker or '')
  local threshold = ok and type(doc) == 'table' and tonumber(doc['threshold'])
  if not threshold or n >= threshold or kept then return 0 end
  redis_call('DEL', KEYS[2])
  return 1
end
if n < tonumber(ARGV[2]) then
  if not kept then redis_call('DEL', KEYS[2]) end
  return 0
end
if redis_call('SET', KEYS[2], ARGV[3], 'NX', 'PX', ARGV[4]) then
  return n
end
return 0
