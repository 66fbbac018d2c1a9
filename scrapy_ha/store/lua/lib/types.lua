--- @include "time"
--- @include "number"
-- lib/types: the check that runs before a script's first write.
--
-- wrong_type(script, keys, types)
--   keys: the script's KEYS; types[i]: the Redis type keys[i] must have (nil: not checked).
--   Returns an error reply 'WRONGTYPE <script>: <key> holds a <type>' for the first key of
--   another type (a missing key is fine), or nil.
--   Rule: a key of the wrong type fails the call before any write, so the entry stays
--   where it was; the worker sets the key aside and retries the call.
local function wrong_type(script, keys, types)
  for i = 1, #keys do
    local want = types[i]
    if want then
      local ty = redis_call('TYPE', keys[i])['ok']
      if ty ~= 'none' and ty ~= want then
        return redis.error_reply('WRONGTYPE ' .. script .. ': ' .. keys[i] .. ' holds a ' .. ty)
      end
    end
  end
  return nil
end

-- aside_name(key)
--   Returns the name a key of the wrong type is renamed to: "<key>:corrupt:<seconds>", with
--   ".<n>" added when that name is taken (an earlier copy is never overwritten). It shares
--   the key's hash tag, so the rename stays in its slot.
local function aside_name(key)
  local stamp = key .. ':corrupt:' .. int_str(math_floor(now_ms() / 1000))
  local target, n = stamp, 0
  while redis_call('EXISTS', target) == 1 do
    n = n + 1
    target = stamp .. '.' .. n
  end
  return target
end

-- WIDE_BYTES: the length of a member longer than any zset-max-listpack-value an operator
-- sets (64 bytes by default): added to a sorted set, it converts the set to a skip list,
-- which it stays until the key is deleted (Redis never converts one back while it lives).
local WIDE_BYTES = 1024

-- keep_skiplist(key)
--   Makes the sorted set key a skip list if it is a small one kept as a listpack (ziplist
--   on Redis 6.2): a member added and taken away in the same call, so nobody sees it.
--   Rule: for the frontier's ready set (a member per back queue), which a sync call
--   updates at several places and which stays under zset-max-listpack-entries (128) in a
--   crawl of few hosts: a listpack is a flat array that an insert or an update searches
--   and moves from end to end, a skip list a few levels of pointers (measured with 50
--   hosts: 1.5 % of a sync call of 10 requests, 3 % at 30, bench/script_cost.py). The skip
--   list's extra bytes per member are a few kilobytes for 128 queues. A set made again
--   (deleted when it emptied, or reloaded from disk as a listpack) is converted by the
--   next call. Not for the leased set: emptied and made again by every call of a lone
--   worker, it would pay the conversion each time.
local function keep_skiplist(key)
  local enc = redis_call('OBJECT', 'ENCODING', key)
  if enc == 'listpack' or enc == 'ziplist' then
    local wide = string.rep('~', WIDE_BYTES)
    redis_call('ZADD', key, '0', wide)
    redis_call('ZREM', key, wide)
  end
end
