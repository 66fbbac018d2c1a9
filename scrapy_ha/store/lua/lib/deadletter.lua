-- lib/deadletter: the dead-letter queue: the dead sorted set (entry id -> time it was
-- dead-lettered, ms), dead_info (entry id -> JSON) and the payload hash.
--
-- dead_letter(dead, dead_info, id, info, now)
--   KEYS: dead, dead_info (the caller's KEYS[i])
--   Records entry id as dead at time now; info (a table: class, reason, ...) is stored as
--   JSON with "last" = now and "first" = now unless it has one already (a request
--   dead-lettered before, then requeued by the operator, keeps its first time).
--   Rule: it never fails (its callers wrote before it): a record cjson cannot encode (NaN
--   or Inf, which cjson decodes from a caller's JSON and refuses to encode) is stored as its
--   class and reason, with "record": "unreadable".
local function dead_letter(dead, dead_info, id, info, now)
  info['last'] = now
  if not info['first'] then info['first'] = now end
  local ok, record = pcall(cjson.encode, info)
  if not ok then
    local class, reason = info['class'], info['reason']
    record = cjson.encode({
      class = type(class) == 'string' and class or 'unknown',
      reason = type(reason) == 'string' and reason or '',
      first = now, last = now, record = 'unreadable'})
  end
  redis.call('ZADD', dead, now, id)
  redis.call('HSET', dead_info, id, record)
end

-- Rule: an entry's field in dead_archived is "<dead-letter time> <sink id> [<sink id> ...]":
-- the version of the entry archived, and every SQL archive (sink) that holds that version.
-- A bare "<time>" was written before sinks were told apart: it names no sink.

-- archive_version(mark)
--   The dead-letter time an entry's mark names (a number), or nil for no mark.
local function archive_version(mark)
  return mark and tonumber(string.match(mark, '^%-?%d+'))
end

-- mark_archived(dead_archived, id, at, sink)
--   KEYS: dead_archived (the caller's KEYS[i])
--   Records that sink holds version at (a dead-letter time, as text) of entry id. A newer
--   version replaces an older one and its sinks (they hold the old one: each copies the
--   entry again); an older version than the mark's is ignored (a copier that read the entry
--   before it died again). Returns true when the sink holds version at now.
local function mark_archived(dead_archived, id, at, sink)
  local cur = redis.call('HGET', dead_archived, id)
  local cur_at, new_at = archive_version(cur), tonumber(at)
  if not cur_at or cur_at < new_at then
    redis.call('HSET', dead_archived, id, at .. ' ' .. sink)
    return true
  end
  if cur_at > new_at then return false end
  if not string.find(' ' .. cur .. ' ', ' ' .. sink .. ' ', 1, true) then
    redis.call('HSET', dead_archived, id, cur .. ' ' .. sink)
  end
  return true
end

-- archived(dead, dead_archived, id)
--   KEYS: dead, dead_archived (the caller's KEYS[i])
--   Whether entry id may leave Redis for good: no SQL archive is declared for the crawl
--   (no field '~archive' in dead_archived), or the version in the dead-letter queue (its
--   dead-letter time) is one that some archive holds. A requeued and dead-lettered again
--   entry has a newer time: not archived until it is copied again.
local function archived(dead, dead_archived, id)
  if redis.call('HEXISTS', dead_archived, '~archive') == 0 then return true end
  local at = archive_version(redis.call('HGET', dead_archived, id) or nil)
  return at ~= nil and at == tonumber(redis.call('ZSCORE', dead, id))
end

-- drop_dead(dead, dead_info, payload, dead_archived, urls, id)
--   KEYS: dead, dead_info, payload, dead_archived, urls (revisit_urls; the caller's KEYS[i])
--   Dead letter id goes for good: its entry, record, payload and archive mark, and the
--   fingerprint a copy of its URL left it under "x:<id>" in urls for a requeue (lib/revisit:
--   revisit_claim), which nothing else would take away before the crawl's finish.
local function drop_dead(dead, dead_info, payload, dead_archived, urls, id)
  redis.call('ZREM', dead, id)
  redis.call('HDEL', dead_info, id)
  redis.call('HDEL', payload, id)
  redis.call('HDEL', dead_archived, id)
  redis.call('HDEL', urls, 'x:' .. id)
end

-- trim_dead(dead, dead_info, payload, now, max_entries, max_age_ms, dead_archived, urls)
--   KEYS: dead, dead_info, payload, dead_archived, urls (revisit_urls; the caller's KEYS[i])
--   Rule: retention. The dead-letter queue keeps at most max_entries entries, none older
--   than max_age_ms: the oldest go for good (info and payload too), at most 100 of each
--   kind per call so that one call stays short; later calls continue. With an archive
--   declared, an entry not archived yet stays (the archive catches up, then it goes).
local function trim_dead(dead, dead_info, payload, now, max_entries, max_age_ms, dead_archived,
                         urls)
  local old = redis.call('ZRANGEBYSCORE', dead, '-inf', now - max_age_ms, 'LIMIT', 0, 100)
  local excess = redis.call('ZCARD', dead) - #old - max_entries
  if excess > 0 then
    local more = redis.call('ZRANGE', dead, #old, #old + math.min(excess, 100) - 1)
    for _, id in ipairs(more) do old[#old + 1] = id end
  end
  for _, id in ipairs(old) do
    if archived(dead, dead_archived, id) then
      drop_dead(dead, dead_info, payload, dead_archived, urls, id)
    end
  end
end
