-- lib/deadletter: the dead-letter queue: the dead sorted set (entry id -> time it was
-- dead-lettered, ms), dead_info (entry id -> JSON) and the payload hash.
--
-- dead_letter(dead, dead_info, id, info, now)
--   KEYS: dead, dead_info (the caller's KEYS[i])
--   Records entry id as dead at time now; info (a table: class, reason, ...) is stored as
--   JSON with "last" = now and "first" = now unless it has one already (a request
--   dead-lettered before, then requeued by the operator, keeps its first time).
local function dead_letter(dead, dead_info, id, info, now)
  info['last'] = now
  if not info['first'] then info['first'] = now end
  redis.call('ZADD', dead, now, id)
  redis.call('HSET', dead_info, id, cjson.encode(info))
end

-- trim_dead(dead, dead_info, payload, now, max_entries, max_age_ms)
--   KEYS: dead, dead_info, payload (the caller's KEYS[i])
--   Rule: retention. The dead-letter queue keeps at most max_entries entries, none older
--   than max_age_ms: the oldest go for good (info and payload too), at most 100 of each
--   kind per call so that one call stays short; later calls continue.
local function trim_dead(dead, dead_info, payload, now, max_entries, max_age_ms)
  local old = redis.call('ZRANGEBYSCORE', dead, '-inf', now - max_age_ms, 'LIMIT', 0, 100)
  local excess = redis.call('ZCARD', dead) - #old - max_entries
  if excess > 0 then
    local more = redis.call('ZRANGE', dead, #old, #old + math.min(excess, 100) - 1)
    for _, id in ipairs(more) do old[#old + 1] = id end
  end
  for _, id in ipairs(old) do
    redis.call('ZREM', dead, id)
    redis.call('HDEL', dead_info, id)
    redis.call('HDEL', payload, id)
  end
end
