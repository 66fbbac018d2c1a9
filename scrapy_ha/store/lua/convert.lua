-- convert: move the pending requests of a crawl stored before the back queues (one sorted
-- set 'pending' of "<id> <payload>" members, scored as lib/priority scores) into their
-- back queues (lib/frontier), best score first, a batch per call: each keeps its id and
-- its place (its score), and goes to the queue of its priority and of its URL's host.
-- Rule: a member leaves the sorted set only in the call that puts it in its back queue.
-- KEYS[1] pending (the old sorted set)  KEYS[2] the back queues' prefix  KEYS[3] ready
-- KEYS[4] waiting  KEYS[5] queued (lib/frontier)
-- ARGV[1] most members converted by this call
-- ARGV[2] the crawl's order within a priority (order_flags, lib/frontier)
-- Returns {converted, left in the sorted set}.
--- @include "types"
--- @include "stats"
--- @include "frontier"
local batch = tonumber(ARGV[1])
local lifo, start_lifo = order_flags(ARGV[2])
if not batch or batch < 1 or lifo == nil then
  return redis.error_reply('ERR convert: a batch size, then the order')
end
local err = wrong_type('convert', KEYS, {'zset', nil, 'zset', 'zset', 'string'})
if err then return err end
frontier_open(KEYS[2], KEYS[3], KEYS[4], KEYS[5], lifo, start_lifo)
local members = redis_call('ZRANGE', KEYS[1], 0, batch - 1, 'WITHSCORES')
local was_empty = {} -- qid -> whether its back queue held nothing before this call
for i = 1, #members, 2 do
  local m = members[i]
  local id, payload = str_match(m, '^([^ ]*) (.*)$') -- the old form: id, a space, payload
  if not id then id, payload = '', m end -- no space: no id, set aside when leased
  -- (a score past every priority, +inf or -inf written by hand, has none: the nearest)
  local score = math_max(-MAX_PRIORITY * PRIORITY_STEP,
    math_min(MAX_PRIORITY * PRIORITY_STEP, tonumber(members[i + 1]) or 0))
  local qid, place = queue_of(score, domain_of(payload))
  if was_empty[qid] == nil then was_empty[qid] = queue_empty(qid) end
  if was_empty[qid] then
    frontier_append(qid, id, place, payload)
  else
    frontier_return(qid, id, place, payload)
  end
end
frontier_write()
if #members > 0 then redis_call('ZREMRANGEBYRANK', KEYS[1], 0, #members / 2 - 1) end
frontier_close()
return {#members / 2, redis_call('ZCARD', KEYS[1])}
