-- alert: decide, once for all workers, that the dead-letter queue crossed the alert
-- threshold: the first caller that sees it at or above the threshold sets the marker and
-- sends the alert; once it is back below, the marker goes and the next crossing alerts again.
-- KEYS[1] dead  KEYS[2] dlq_alert marker
-- ARGV[1] threshold (entries)  ARGV[2] what the marker holds
-- Returns the number of dead letters when this caller is to send the alert, else 0.
local n = redis_call('ZCARD', KEYS[1])
if n < tonumber(ARGV[1]) then
  redis_call('DEL', KEYS[2])
  return 0
end
if redis_call('SET', KEYS[2], ARGV[2], 'NX') then
  return n
end
return 0
