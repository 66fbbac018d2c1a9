--- @include "number"
-- lib/member: a pending entry is one sorted-set member "<id> <payload>" (no separate payload
-- while it waits: that keeps a queued request small). Entry ids never hold a space.
--
-- member(id, payload)
--   Returns the pending member of entry id.
local function member(id, payload)
  return id .. ' ' .. payload
end

-- split_member(m)
--   Returns id, payload of a pending member: the id is '' when the member starts with a
--   space (it cannot be leased: corrupt), the payload '' when there is no space at all.
local function split_member(m)
  local space = string.find(m, ' ', 1, true)
  if not space then return m, '' end
  return string.sub(m, 1, space - 1), string.sub(m, space + 1)
end

-- valid_id(id)
--   Returns true when id can name an entry in a member: not empty and without a space
--   (the first space ends the id).
local function valid_id(id)
  return id ~= '' and not string.find(id, ' ', 1, true)
end

-- push_pending(pending, id, score, payload)
--   KEYS: pending (the caller's KEYS[i])
--   Adds entry id to pending at score, its payload inside the member.
local function push_pending(pending, id, score, payload)
  redis.call('ZADD', pending, int_str(score), member(id, payload))
end

-- back_to_pending(pending, payloads, id, score)
--   KEYS: pending, the payload hash (the caller's KEYS[i])
--   Moves entry id (leased or delayed) back to pending at score: its payload leaves the
--   payload hash for the member ('' when it has none: the worker that leases it
--   dead-letters it as corrupt).
local function back_to_pending(pending, payloads, id, score)
  push_pending(pending, id, score, redis.call('HGET', payloads, id) or '')
  redis.call('HDEL', payloads, id)
end
