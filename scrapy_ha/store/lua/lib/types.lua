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
